//! The parts of a decoder graph that every attention family shares: the
//! plan (one cache need per layer, from config alone) and the end of a
//! forward pass (logits by mode, final hidden state, taps).

use crate::config::Config;
use crate::{Array, Result};
use plugin_api::abi_stable::std_types::ROption;
use plugin_api::{Dtype, ForwardArgs, ForwardOutput, LayerNeed, LogitsMode, ModelPlan, Tensor};
use plugin_sdk::{into_tensor, rstrings};

/// The geometry an attention decoder declares before any weight is read.
pub struct AttentionShape<'a> {
    /// Per layer: sliding-window attention (else full).
    pub sliding: &'a [bool],
    pub window: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub hidden: usize,
    pub max_context: usize,
}

/// One need per layer, the checkpoint's dtype and quantization from config,
/// and the capabilities every attention family built on model-kit has.
pub fn attention_plan(cfg: &Config, s: &AttentionShape) -> ModelPlan {
    let layers = s
        .sliding
        .iter()
        .map(|&sl| match sl {
            true => LayerNeed::sliding(s.window as u32, s.kv_heads as u32, s.head_dim as u32),
            false => LayerNeed::full(s.kv_heads as u32, s.head_dim as u32),
        })
        .collect();
    let weights_dtype = match cfg.str("torch_dtype").or_else(|| cfg.str("dtype")) {
        Some("bfloat16") => Dtype::BFLOAT16,
        Some("float16") => Dtype::FLOAT16,
        _ => Dtype::FLOAT32,
    };
    let quant = cfg.quantization().ok().flatten();
    ModelPlan {
        layers,
        vocab_size: s.vocab_size as u32,
        hidden_size: s.hidden as u32,
        max_context: s.max_context as u32,
        weights_dtype,
        quant_bits: quant.as_ref().map_or(0, |q| q.default.bits as u32),
        quant_group_size: quant.as_ref().map_or(0, |q| q.default.group_size as u32),
        capabilities: rstrings(&[plugin_api::caps::CONTINUOUS_BATCHING, plugin_api::caps::HIDDEN_TAPS]),
    }
}

/// The forward's token ids `[B, L]` (a view of the host's tensor, which the
/// host keeps owning), once `given` caches have been checked against the
/// `expected` number of layers that hold one.
pub fn input_tokens(args: &ForwardArgs<'_>, given: usize, expected: usize) -> Result<std::mem::ManuallyDrop<Array>> {
    if given != expected {
        return Err(crate::error(format!("forward: {given} caches given for {expected} layers with a cache")));
    }
    let tokens = plugin_sdk::view(args.tokens);
    if tokens.ndim() != 2 {
        return Err(crate::error(format!("forward: tokens must be [B, L], got {:?}", tokens.shape())));
    }
    Ok(tokens)
}

/// Builds the forward output from the final (normed) hidden state `h`
/// `[B, L, H]`: logits at the last position or all of them, as asked (the
/// head runs on the last position only for LAST), the hidden state, and the
/// taps in the order asked.
pub fn finish(
    args: &ForwardArgs<'_>,
    h: Array,
    head: impl Fn(&Array) -> Result<Array>,
    taps: crate::taps::Taps<'_>,
) -> Result<ForwardOutput> {
    let taps = taps.into_tensors()?;
    let logits = match args.logits {
        LogitsMode::ALL => ROption::RSome(into_tensor(head(&h)?)),
        LogitsMode::LAST => {
            let s = h.shape();
            let last = crate::ops::slice(&h, &[0, s[1] - 1, 0], &[s[0], s[1], s[2]])?;
            ROption::RSome(into_tensor(head(&last)?))
        }
        _ => ROption::RNone,
    };
    let hidden = if args.want_hidden { ROption::RSome(into_tensor(h)) } else { ROption::RNone };
    Ok(ForwardOutput { logits, hidden, taps })
}

/// What a model family's graph provides. [`into_model`] wraps it as the
/// ABI's `ModelGraph` (panic guards, tensor hand-over, and the `Sync` the
/// ABI asks for: the family sits behind a [`plugin_sdk::Locked`], so a
/// family of MLX arrays, which are `Send` but not `Sync`, needs no
/// `unsafe impl Sync`). A family writes only its numerics.
pub trait Family: Send + 'static {
    /// The plan computed from config.json at load.
    fn plan(&self) -> &plugin_api::ModelPlan;
    /// One forward pass through the caches (one per layer that holds one).
    fn run(&self, args: &ForwardArgs<'_>, caches: &mut [plugin_api::CacheBox]) -> Result<ForwardOutput>;
    /// The token embedding drafters borrow: `embed_tokens(ids)`, before any
    /// scale the graph applies itself (mlx-lm's `input_embeddings`).
    fn embed_tokens(&self, ids: &Array) -> Result<Array>;
    /// The LM head, with whatever the family applies to its logits.
    fn head(&self, hidden: &Array) -> Result<Array>;
}

struct Graph<F> {
    /// Kept outside the lock: `ModelGraph::plan` cannot report an error.
    plan: plugin_api::ModelPlan,
    family: plugin_sdk::Locked<F>,
    routes: crate::routes::Routes,
}

impl<F: Family> plugin_api::ModelGraph for Graph<F> {
    fn plan(&self) -> plugin_api::ModelPlan {
        self.plan.clone()
    }

    fn forward(
        &self,
        args: ForwardArgs<'_>,
        mut caches: plugin_api::abi_stable::std_types::RSliceMut<'_, plugin_api::CacheBox>,
    ) -> plugin_api::PResult<ForwardOutput> {
        crate::routes::with(self.routes, || {
            plugin_sdk::guard_mlx(|| self.family.lock().run(&args, caches.as_mut_slice()))
        })
    }

    fn embed(&self, tokens: plugin_api::TensorRef<'_>) -> plugin_api::PResult<Tensor> {
        plugin_sdk::guard_mlx(|| Ok(into_tensor(self.family.lock().embed_tokens(&plugin_sdk::view(tokens))?)))
    }

    fn lm_head(&self, hidden: plugin_api::TensorRef<'_>) -> plugin_api::PResult<Tensor> {
        plugin_sdk::guard_mlx(|| Ok(into_tensor(self.family.lock().head(&plugin_sdk::view(hidden))?)))
    }
}

/// A family's graph behind the boundary, taking the kernel routes the
/// host's options ask for (`routes`). Every option must be one of
/// model-kit's: a family with options of its own removes its keys from
/// `args.options` before calling this, or the rest is refused here, at open.
pub fn into_model<F: Family>(
    family: F,
    args: &plugin_api::ModelOpenArgs,
) -> std::result::Result<plugin_api::ModelBox, plugin_api::PluginError> {
    let routes = crate::routes::Routes::from_options(&args.options)
        .map_err(|e| plugin_api::PluginError::invalid_input(e.what()))?;
    let graph = Graph { plan: family.plan().clone(), family: plugin_sdk::Locked::new(family), routes };
    Ok(plugin_api::ModelGraph_TO::from_value(graph, plugin_api::abi_stable::sabi_trait::TD_Opaque))
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::abi_stable::std_types::RSlice;

    fn args(t: &Tensor) -> ForwardArgs<'_> {
        ForwardArgs { tokens: t.borrow(), logits: LogitsMode::LAST, want_hidden: false, taps: RSlice::from_slice(&[]) }
    }

    #[test]
    fn input_tokens_checks_the_cache_count_and_the_rank() {
        let ok = into_tensor(Array::from_slice(&[1i32, 2, 3], &[1, 3]));
        assert_eq!(input_tokens(&args(&ok), 4, 4).unwrap().shape(), [1, 3]);
        let e = input_tokens(&args(&ok), 3, 4).unwrap_err();
        assert!(e.what().contains("3 caches given for 4 layers"), "{}", e.what());
        let flat = into_tensor(Array::from_slice(&[1i32, 2, 3], &[3]));
        let e = input_tokens(&args(&flat), 4, 4).unwrap_err();
        assert!(e.what().contains("tokens must be [B, L]"), "{}", e.what());
    }
}
