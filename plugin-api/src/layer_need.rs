//! What each layer of a model needs from its cache: the model plugin
//! declares it, cache-layout plugins are chosen and sized by it.

use abi_stable::std_types::RVec;
use abi_stable::StableAbi;

/// An open set of per-layer cache kinds (a `u8`).
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NeedKind(pub u8);

impl NeedKind {
    /// Full causal attention over every past token.
    pub const FULL: Self = Self(1);
    /// Attention over the last `window` tokens only.
    pub const SLIDING: Self = Self(2);
    /// A recurrent state (e.g. gated DeltaNet conv + SSM state): not trimmable.
    pub const RECURRENT: Self = Self(3);

    pub fn as_str(self) -> &'static str {
        match self.0 {
            1 => "full",
            2 => "sliding",
            3 => "recurrent",
            _ => "unknown",
        }
    }
}

/// What one layer needs from its cache, declared from config.json alone.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct LayerNeed {
    pub kind: NeedKind,
    /// Sliding window length (SLIDING only; 0 otherwise).
    pub window: u32,
    pub kv_heads: u32,
    pub k_head_dim: u32,
    pub v_head_dim: u32,
    /// RECURRENT only: the shapes of the state slots, per row.
    pub state_shapes: RVec<RVec<i64>>,
}

impl LayerNeed {
    /// Full attention over every position: K and V of `kv_heads` heads of
    /// `head_dim`.
    pub fn full(kv_heads: u32, head_dim: u32) -> Self {
        Self::attention(NeedKind::FULL, 0, kv_heads, head_dim)
    }

    /// Attention over the last `window` positions.
    pub fn sliding(window: u32, kv_heads: u32, head_dim: u32) -> Self {
        Self::attention(NeedKind::SLIDING, window, kv_heads, head_dim)
    }

    /// A recurrent layer's per-row state slots.
    pub fn recurrent(state_shapes: Vec<Vec<i64>>) -> Self {
        Self {
            kind: NeedKind::RECURRENT,
            window: 0,
            kv_heads: 0,
            k_head_dim: 0,
            v_head_dim: 0,
            state_shapes: state_shapes.into_iter().map(RVec::from).collect(),
        }
    }

    fn attention(kind: NeedKind, window: u32, kv_heads: u32, head_dim: u32) -> Self {
        Self { kind, window, kv_heads, k_head_dim: head_dim, v_head_dim: head_dim, state_shapes: RVec::new() }
    }
}
