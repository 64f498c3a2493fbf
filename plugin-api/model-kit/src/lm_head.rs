//! The model's output projection.

use crate::layers::{Embedding, Linear, LoadCtx};
use crate::{Array, Result};

/// The output projection: the checkpoint's own (`lm_head`), or with tied
/// embeddings the embedding matrix.
pub struct LmHead(Option<Linear>);

impl LmHead {
    /// Loads `name` (e.g. `lm_head`, `[vocab, hidden]`) unless `tied`.
    pub fn load(ctx: &mut LoadCtx, name: &str, vocab: usize, hidden: usize, tied: bool) -> Result<Self> {
        Ok(Self(if tied { None } else { Some(Linear::load(ctx, name, vocab, hidden, false)?) }))
    }

    pub fn forward(&self, embed: &Embedding, h: &Array) -> Result<Array> {
        match &self.0 {
            Some(l) => crate::fused_layers::linear(h, l),
            None => embed.as_linear(h),
        }
    }
}
