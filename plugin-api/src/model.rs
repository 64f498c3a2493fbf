//! Model graphs: one family of architectures per plugin.

use crate::cache::CacheBox;
use crate::error::PResult;
// Named through this module too: plugins written against earlier 2.x
// releases import them from here.
pub use crate::layer_need::{LayerNeed, NeedKind};
pub use crate::tensor::Dtype;
use crate::tensor::{Tensor, TensorRef};
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, ROption, RSlice, RSliceMut, RString, RVec, Tuple2};
use abi_stable::StableAbi;

/// A family's plan for a model folder, computed before any weight is read.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ModelPlan {
    /// One entry per layer that holds a cache, in forward order.
    pub layers: RVec<LayerNeed>,
    pub vocab_size: u32,
    pub hidden_size: u32,
    /// The model's context length from config (0 = unknown).
    pub max_context: u32,
    /// The dtype the checkpoint stores its float weights in.
    pub weights_dtype: Dtype,
    /// Quantization of the checkpoint (`bits`, `group_size`; 0 when dense).
    pub quant_bits: u32,
    pub quant_group_size: u32,
    /// Capability tags of this model (may depend on the config).
    pub capabilities: RVec<RString>,
}

/// Arguments of `open_model`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ModelOpenArgs {
    /// The model folder (config.json + weights).
    pub dir: RString,
    /// config.json's text, already read by the host.
    pub config_json: RString,
    /// The compute dtype for float weights; RNone keeps the checkpoint's.
    pub compute_dtype: ROption<Dtype>,
    /// Extra options (`key=value`), for families that take any.
    pub options: RVec<Tuple2<RString, RString>>,
}

/// Which logits a forward pass returns.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogitsMode(pub u8);

impl LogitsMode {
    pub const NONE: Self = Self(0);
    /// Only the last position of each row: `[B, 1, V]`.
    pub const LAST: Self = Self(1);
    /// Every position: `[B, L, V]` (speculative verification).
    pub const ALL: Self = Self(2);
}

/// Inputs of one forward pass. All handles are borrowed for the call.
#[repr(C)]
#[derive(StableAbi)]
pub struct ForwardArgs<'a> {
    /// Token ids, int32 `[B, L]`.
    pub tokens: TensorRef<'a>,
    pub logits: LogitsMode,
    /// Return the final (normed) hidden states `[B, L, H]`.
    pub want_hidden: bool,
    /// Layer indices whose outputs to return as taps (in this order).
    pub taps: RSlice<'a, u32>,
}

/// Outputs of one forward pass; every handle is owned by the caller. The
/// arrays may be lazy: the caller decides when to evaluate.
#[repr(C)]
#[derive(StableAbi)]
pub struct ForwardOutput {
    pub logits: ROption<Tensor>,
    pub hidden: ROption<Tensor>,
    pub taps: RVec<Tensor>,
}

/// A loaded model graph.
///
/// The graph never knows the type of its caches: it calls each layer's
/// [`crate::CacheLayout`] (positions, mask, update_and_fetch) in forward order.
#[sabi_trait]
pub trait ModelGraph: Send + Sync {
    /// The plan this graph was opened with (same as `plan_model` on its config).
    fn plan(&self) -> ModelPlan;

    /// Runs the graph over `args.tokens`, appending to `caches` (one per
    /// entry of `plan().layers`, in order).
    fn forward(&self, args: ForwardArgs<'_>, caches: RSliceMut<'_, CacheBox>) -> PResult<ForwardOutput>;

    /// Token embeddings `[B, L, H]` for int32 ids `[B, L]`.
    fn embed(&self, tokens: TensorRef<'_>) -> PResult<Tensor>;

    /// Logits for final (normed) hidden states.
    #[sabi(last_prefix_field)]
    fn lm_head(&self, hidden: TensorRef<'_>) -> PResult<Tensor>;
}

/// A model graph behind the boundary.
pub type ModelBox = ModelGraph_TO<'static, RBox<()>>;
