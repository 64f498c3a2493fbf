//! The drafter's weights, loaded once per folder and compute dtype and
//! shared by every instance the host opens (one per speculating batch row):
//! an instance owns only its caches and round state.

use crate::block::Block;
use crate::config::Args;
use crate::draft_vocab::DraftVocab;
use crate::markov::{Confidence, Markov};
use model_kit::layers::{Embedding, Linear, LoadCtx};
use model_kit::Array;
use plugin_api::PluginError;
use plugin_sdk::mlx_rs::Dtype;
use plugin_sdk::Locked;
use std::path::Path;
use std::sync::Arc;

pub struct Net {
    pub block: Block,
    pub markov: Option<Markov>,
    pub confidence: Option<Confidence>,
    /// The drafter's own embedding and LM head (DeepSpec); else the
    /// target's, through `HostServices`.
    pub vocab: Option<Vocab>,
    /// speculators' reduced draft vocabulary.
    pub draft_vocab: Option<DraftVocab>,
}

pub struct Vocab {
    embed: Embedding,
    scale: f32,
    lm_head: Linear,
}

impl Vocab {
    /// `embed_tokens(ids) * scale`, the scale in the embedding's dtype as
    /// a Python float multiplies it.
    pub fn embed(&self, ids: &Array) -> model_kit::Result<Array> {
        let e = self.embed.forward(ids)?;
        e.multiply(&Array::from_f32(self.scale).as_dtype(e.dtype())?)
    }

    pub fn logits(&self, h: &Array) -> model_kit::Result<Array> {
        self.lm_head.forward(h)
    }
}

impl Net {
    pub fn load(ctx: &mut LoadCtx, a: &Args) -> model_kit::Result<Self> {
        let block = Block::load(ctx, a)?;
        let draft_vocab = a.draft_vocab.map(|d| DraftVocab::load(ctx, d, a.vocab_size, a.hidden)).transpose()?;
        let out = a.draft_vocab.unwrap_or(a.vocab_size);
        let markov =
            a.markov.map(|(kind, rank)| Markov::load(ctx, kind, a.vocab_size, out, rank, a.hidden)).transpose()?;
        let rank = a.markov.map_or(0, |m| m.1);
        let confidence = a.confidence.map(|with| Confidence::load(ctx, a.hidden, rank, with)).transpose()?;
        let vocab = match a.own_vocab {
            Some(scale) => Some(Vocab {
                embed: Embedding::load(ctx, "embed_tokens", a.vocab_size, a.hidden)?,
                scale,
                lm_head: Linear::load(ctx, "lm_head", a.vocab_size, a.hidden, false)?,
            }),
            None => None,
        };
        Ok(Self { block, markov, confidence, vocab, draft_vocab })
    }
}

/// The net of `dir` in `dtype`: the one already loaded, else `load`'s.
pub fn shared(
    dir: &Path,
    dtype: Dtype,
    load: impl FnOnce() -> Result<Net, PluginError>,
) -> Result<Arc<Locked<Net>>, PluginError> {
    plugin_sdk::shared::shared(&format!("{}|{dtype:?}", dir.display()), load)
}
