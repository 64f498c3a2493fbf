//! A checkpoint's tensors against config.json: every layer constructor
//! takes the shape the config implies and checks the tensor it reads before
//! any graph is built. Without it a config whose heads do not match the
//! weights loads fine and the first request fails far away (a reshape, or
//! keys of the wrong width handed to a cache layout, which then gets the
//! blame).

use crate::{error, Result};

/// Fails naming the tensor, its shape and the shape config.json implies.
pub fn expect_shape(name: &str, actual: &[i32], expected: &[usize]) -> Result<()> {
    let same = actual.len() == expected.len() && actual.iter().zip(expected).all(|(&a, &e)| a as i64 == e as i64);
    if same {
        return Ok(());
    }
    Err(error(format!("checkpoint tensor `{name}` has shape {actual:?}, config.json implies {expected:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatch_names_the_tensor_and_both_shapes() {
        assert!(expect_shape("w", &[4, 8], &[4, 8]).is_ok());
        let e = expect_shape("model.layers.0.self_attn.k_proj.weight", &[32, 64], &[64, 64]).unwrap_err();
        assert_eq!(
            e.what(),
            "checkpoint tensor `model.layers.0.self_attn.k_proj.weight` has shape [32, 64], config.json implies [64, 64]"
        );
        assert!(expect_shape("b", &[4], &[4, 1]).is_err());
    }
}
