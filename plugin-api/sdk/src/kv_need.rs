//! What every cache layout checks and answers alike: the keys and values an
//! update brings against the need the layout was built for, and the mask for
//! new queries when no row is padded and no window hides a key.

use crate::into_tensor;
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::ROption;
use plugin_api::{AttentionMask, MaskMode, PluginError};

/// Heads and widths of one layer's keys and values, as the family declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub heads: i32,
    pub k_dim: i32,
    pub v_dim: i32,
}

impl KvShape {
    /// Fails unless `k` is `[B, heads, L, k_dim]` and `v` `[B, heads, L, v_dim]`
    /// (the row count is the layout's to check), naming `layout`.
    pub fn check(&self, layout: &str, k: &Array, v: &Array) -> Result<(), PluginError> {
        let (ks, vs) = (k.shape(), v.shape());
        let fits = ks.len() == 4
            && vs.len() == 4
            && ks[1] == self.heads
            && vs[1] == self.heads
            && ks[3] == self.k_dim
            && vs[3] == self.v_dim
            && ks[0] == vs[0]
            && ks[2] == vs[2];
        if fits {
            return Ok(());
        }
        Err(PluginError::invalid_input(format!(
            "{layout}: keys {ks:?} / values {vs:?} do not match the declared need \
             ([B, {h}, L, {kd}] / [B, {h}, L, {vd}])",
            h = self.heads,
            kd = self.k_dim,
            vd = self.v_dim
        )))
    }
}

/// The mask of `queries` new queries over unpadded rows: none for one query
/// (it sees every stored key), causal from the end of the keys for more.
pub fn implicit_mask(queries: u32) -> AttentionMask {
    let mode = if queries <= 1 { MaskMode::NONE } else { MaskMode::CAUSAL };
    AttentionMask { mode, array: ROption::RNone }
}

/// An explicit boolean mask `[B, 1, L, K]`.
pub fn array_mask(mask: Array) -> AttentionMask {
    AttentionMask { mode: MaskMode::ARRAY, array: ROption::RSome(into_tensor(mask)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: KvShape = KvShape { heads: 2, k_dim: 8, v_dim: 4 };

    fn zeros(shape: &[i32]) -> Array {
        mlx_rs::ops::zeros::<f32>(shape).unwrap()
    }

    #[test]
    fn keys_and_values_of_the_declared_shape_pass() {
        assert!(SHAPE.check("t", &zeros(&[3, 2, 5, 8]), &zeros(&[3, 2, 5, 4])).is_ok());
    }

    #[test]
    fn every_mismatch_is_refused_with_the_layout_named() {
        let k = zeros(&[3, 2, 5, 8]);
        for (k, v) in [
            (zeros(&[3, 2, 5, 8]), zeros(&[3, 2, 5])),    // values not 4-D
            (zeros(&[2, 5, 8]), zeros(&[3, 2, 5, 4])),    // keys not 4-D
            (zeros(&[3, 1, 5, 8]), zeros(&[3, 2, 5, 4])), // key heads
            (k.clone(), zeros(&[3, 1, 5, 4])),            // value heads
            (zeros(&[3, 2, 5, 7]), zeros(&[3, 2, 5, 4])), // key width
            (k.clone(), zeros(&[3, 2, 5, 8])),            // value width
            (k.clone(), zeros(&[2, 2, 5, 4])),            // rows differ
            (k.clone(), zeros(&[3, 2, 4, 4])),            // lengths differ
        ] {
            let e = SHAPE.check("kv-test", &k, &v).unwrap_err();
            assert!(e.message.as_str().starts_with("kv-test: keys"), "{}", e.message);
        }
    }

    #[test]
    fn one_query_is_unmasked_and_more_are_causal() {
        assert_eq!(implicit_mask(1).mode, MaskMode::NONE);
        assert_eq!(implicit_mask(0).mode, MaskMode::NONE);
        assert_eq!(implicit_mask(2).mode, MaskMode::CAUSAL);
        assert!(implicit_mask(7).array.is_none());
        assert_eq!(array_mask(zeros(&[1, 1, 2, 3])).mode, MaskMode::ARRAY);
    }
}
