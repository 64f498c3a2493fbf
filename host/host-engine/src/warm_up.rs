//! One-time costs of the batched path paid before the first request: a
//! left-padded batch of two rows prefills two tokens and decodes one step,
//! so that whatever the device compiles on first use for padded rows (on a
//! GPU: the masked decode kernel, its merge, the padded prefill's kernels)
//! is compiled before a client waits on it. On an H200 the first padded
//! step of the Qwen3-8B shape took 3.8 s without it (docs/benchmarks.md,
//! "Rows of different lengths"). Nothing of it is kept: the caches are
//! dropped, and no counter, prefix-cache entry or row sees it.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::tensors::token_array_rows;
use plugin_api::abi_stable::std_types::RSlice;

/// Runs the padded batch; a model whose layouts cannot start padded rows
/// skips it (its first padded step pays the compile instead).
pub fn padded_rows(engine: &Engine) -> Result<(), EngineError> {
    let mut caches = engine.model().new_caches(0)?;
    for c in caches.iter_mut() {
        if c.begin_padded(RSlice::from_slice(&[1, 0])).into_result().is_err() {
            return Ok(());
        }
    }
    let prompt = engine.forward(&token_array_rows(&[vec![0, 0], vec![0, 0]]), &mut caches, false)?;
    prompt.eval()?;
    let step = engine.forward(&token_array_rows(&[vec![0], vec![0]]), &mut caches, false)?;
    step.eval()?;
    Ok(())
}
