//! `host kv-kl`: how far a KV scheme moves the model's next-token
//! distributions from those over plain K/V, on a text: KL(plain || scheme)
//! at every position, both runs fed the same tokens `chunk` at a time
//! through fresh caches (with `--quantized-kv-start 0` every chunk after
//! the first attends codes).

use anyhow::{bail, Result};
use host_engine::Engine;
use mlx_rs::Array;
use serde_json::json;

pub struct KlArgs {
    pub tokens: Vec<u32>,
    pub chunk: usize,
}

/// Compares `scheme` against `plain` (the same model, plain K/V).
pub fn run(plain: &Engine, scheme: &Engine, a: KlArgs) -> Result<serde_json::Value> {
    if a.tokens.len() < 2 * a.chunk {
        bail!("the text gives {} tokens: at least two chunks of {} are needed", a.tokens.len(), a.chunk);
    }
    let mut reference: Vec<Array> = Vec::new();
    plain.next_token_logprobs(&a.tokens, a.chunk, |_, lp| {
        reference.push(lp.clone());
        Ok(())
    })?;
    let (mut kl, mut kl_coded, mut max_kl, mut agree, mut n, mut n_coded) = (0.0, 0.0, 0.0f64, 0usize, 0usize, 0usize);
    let mut chunks = reference.into_iter();
    scheme.next_token_logprobs(&a.tokens, a.chunk, |first, q| {
        let p = chunks.next().expect("one reference chunk per chunk");
        // Σ_v p (log p - log q) per row, and whether the argmaxes agree.
        let rows = p.exp()?.multiply(p.subtract(q)?)?.sum_axis(-1, false)?;
        let same =
            mlx_rs::ops::indexing::argmax_axis(&p, -1, false)?.eq(mlx_rs::ops::indexing::argmax_axis(q, -1, false)?)?;
        rows.eval()?;
        same.eval()?;
        for (r, &s) in rows.as_slice::<f32>().iter().zip(same.as_slice::<bool>()) {
            let r = *r as f64;
            kl += r;
            max_kl = max_kl.max(r);
            agree += usize::from(s);
            n += 1;
            if first > 0 {
                kl_coded += r;
                n_coded += 1;
            }
        }
        Ok(())
    })?;
    Ok(json!({
        "kv_scheme": scheme.model().scheme,
        "layers": scheme.model().scheme_summary(),
        "compute_dtype": scheme.dtype_name(),
        "tokens": n,
        "chunk": a.chunk,
        "mean_kl": kl / n as f64,
        "mean_kl_after_the_first_chunk": kl_coded / n_coded.max(1) as f64,
        "max_kl": max_kl,
        "top1_agreement": agree as f64 / n as f64,
    }))
}
