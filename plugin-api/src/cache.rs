//! Cache layouts: per-layer storage of keys/values (or recurrent state) in
//! one scheme, as a plugin.
//!
//! Call protocol inside one layer of a forward pass (the model graph's side):
//! 1. `positions()` gives the RoPE offset (scalar, or per row when batched);
//! 2. `attention_mask(L)` for the L new queries, asked BEFORE the update;
//! 3. `update_and_fetch(k, v)` stores the new keys/values (transferred) and
//!    returns owned handles to everything to attend over (a graph about to
//!    attend calls `update_for_queries(q, k, v)` instead, and attends with
//!    the queries it returns); or, for a graph
//!    that lets the layout attend (`caps::LAYOUT_ATTENTION`), first
//!    `attend(q, k, v, scale, mask)`: a layout whose K/V only it can read
//!    (a quantized scheme) stores them and returns the attention output, a
//!    plain one declines and the graph goes on with `update_and_fetch`.
//!
//! The host drives everything else: trim, speculative rounds, state
//! export/import for prefix caching, and row operations for batching.

use crate::error::PResult;
use crate::layer_need::LayerNeed;
use crate::tensor::{Dtype, Tensor, TensorRef};
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, ROption, RSlice, RString, RVec};
use abi_stable::StableAbi;

/// What to create: one layer's need, in a scheme, for a batch width.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct CacheSpec {
    pub need: LayerNeed,
    /// `plain` (the model's dtype), or a quantized scheme with its
    /// parameters: `<name>[:<key>=<value>,...]`, e.g.
    /// `affine8:group=64,start=0`. Layouts claim the name (`scheme:affine8`);
    /// the parameters are the layout's to read.
    pub scheme: RString,
    /// Storage dtype for `plain`.
    pub dtype: Dtype,
    /// Rows this cache starts with (1 = serial). A batched layout may start
    /// empty (0) and receive rows through `merge_rows`.
    pub rows: u32,
    /// Growth step in tokens (storage grows in steps, written in place).
    pub step: u32,
}

/// Everything to attend over after an update; owned by the caller.
#[repr(C)]
#[derive(StableAbi)]
pub struct KvPair {
    pub keys: Tensor,
    pub values: Tensor,
}

/// How to mask attention for the next queries.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskMode(pub u8);

impl MaskMode {
    /// No mask (a single query attends to everything stored).
    pub const NONE: Self = Self(0);
    /// Causal, aligned to the end of the keys (the fused kernel's mode).
    pub const CAUSAL: Self = Self(1);
    /// The explicit boolean mask in `AttentionMask::array` (`[B, 1, L, K]`).
    pub const ARRAY: Self = Self(2);
}

#[repr(C)]
#[derive(StableAbi)]
pub struct AttentionMask {
    pub mode: MaskMode,
    pub array: ROption<Tensor>,
}

/// A mask as [`CacheLayout::attend`] receives it: borrowed for the call.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct MaskRef<'a> {
    pub mode: MaskMode,
    /// The boolean mask for `MaskMode::ARRAY`.
    pub array: ROption<TensorRef<'a>>,
}

/// Where the next tokens sit, for RoPE.
#[repr(C)]
#[derive(StableAbi)]
pub struct Positions {
    /// The offset shared by all rows (serial: the token count so far).
    pub offset: u64,
    /// When rows differ (left-padded batches): int32 `[B]` offsets.
    pub per_row: ROption<Tensor>,
}

/// A layout's exported state: opaque to the host except for its signature
/// and token count. Importing state with another signature is refused.
#[repr(C)]
#[derive(StableAbi)]
pub struct CacheState {
    pub signature: RString,
    /// Tokens represented (per row, the maximum).
    pub offset: u64,
    pub tensors: RVec<Tensor>,
    /// Layout-defined integers (ring positions, per-row offsets, ...).
    pub meta: RVec<u64>,
}

/// One layer's cache.
#[sabi_trait]
pub trait CacheLayout: Send {
    /// A MANDATORY identity of the layout, scheme and geometry, e.g.
    /// `kv:plain:float32:h2:d16`. Persistence and reuse key on it.
    fn signature(&self) -> RString;

    /// Tokens seen so far (per row, the maximum): the position of the next
    /// token. A ring layout holds fewer than this once it wraps.
    fn offset(&self) -> u64;

    /// RoPE positions for the next tokens.
    fn positions(&self) -> PResult<Positions>;

    /// The mask for `queries` new tokens, asked before `update_and_fetch`.
    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask>;

    /// Appends keys/values `[B, H, L, D]` (transferred) and returns what to
    /// attend over (owned).
    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair>;

    /// Whether `trim` can remove tokens right now (a wrapped ring cannot).
    fn is_trimmable(&self) -> bool;

    /// Removes up to `n` trailing tokens; returns how many were removed.
    fn trim(&mut self, n: u64) -> u64;

    /// Bytes one more token costs across all rows (memory admission).
    fn bytes_per_token(&self) -> u64;

    /// A snapshot of the stored tokens (for prefix and disk caches).
    fn export_state(&self) -> PResult<CacheState>;

    /// Replaces the content with a snapshot of the same signature.
    fn import_state(&mut self, state: CacheState) -> PResult<()>;

    /// Starts a speculative round: remembers the current position of each
    /// row. A layout advertising `caps::SPEC_PIPELINE` may be asked while
    /// rounds are open: the new round is the youngest.
    fn spec_begin(&mut self) -> PResult<()>;

    /// Accepts everything appended since `spec_begin` (of the OLDEST open
    /// round, when rounds overlap).
    fn spec_commit(&mut self) -> PResult<()>;

    /// Keeps `keep[row]` of the tokens appended since `spec_begin` (one
    /// entry, or one per row) and drops the rest: by trim for KV layouts, by
    /// snapshot and replay for recurrent state. When rounds overlap, the
    /// counts are of the oldest round, and every younger round is dropped.
    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()>;

    /// Rows held (1 for a serial cache).
    fn rows(&self) -> u32;

    /// Keeps only the listed rows, in that order.
    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()>;

    /// One row as a serial (1-row) state of this layout's scheme.
    fn extract_row(&self, row: u32) -> PResult<CacheState>;

    /// Appends rows given as serial states; rows of different lengths are
    /// left-padded to a common length (per-row positions and masks follow).
    fn merge_rows(&mut self, rows: RVec<CacheState>) -> PResult<()>;

    /// Recurrent layouts: state slot `i` (e.g. 0 = conv, 1 = SSM state).
    fn get_slot(&self, i: u32) -> PResult<ROption<Tensor>>;

    /// Recurrent layouts: replaces state slot `i`.
    #[sabi(last_prefix_field)]
    fn set_slot(&mut self, i: u32, value: Tensor) -> PResult<()>;

    // --- v1.1: appended after the prefix; plugins built against v1.0 lack
    // them and get the default (abi_stable calls it when the vtable is short).

    /// Makes an EMPTY cache hold `pads.len()` rows whose next updates carry
    /// `pads[r]` padding tokens at the front of row r: a cohort of prompts
    /// of different lengths prefilled as one left-padded `[B, L]` batch.
    /// Positions and masks then hide the padding exactly as after
    /// `merge_rows`. A layout that cannot refuses, and the host prefills
    /// those rows one at a time.
    fn begin_padded(&mut self, pads: RSlice<'_, u32>) -> PResult<()> {
        let _ = pads;
        abi_stable::std_types::RResult::RErr(crate::error::PluginError::unsupported(
            "this cache layout cannot start left-padded rows",
        ))
    }

    // --- v2.2: appended after the prefix.

    /// Attention by the layout itself, for K/V kept in a form only the
    /// layout can attend over (quantized schemes attend through quantized
    /// matmuls). A graph that advertises `caps::LAYOUT_ATTENTION` calls it
    /// in place of `update_and_fetch`: the layout stores `keys`/`values`
    /// `[B, H_kv, L, D]` and returns `softmax(scale * q Kᵀ, masked) V`
    /// `[B, H_q, L, D_v]` for `queries` `[B, H_q, L, D]`, with `mask` as
    /// the graph's sdpa would apply it. A layout that declines (the default)
    /// stores nothing and answers `RNone`; the graph then calls
    /// `update_and_fetch` and attends itself.
    fn attend(
        &mut self,
        queries: TensorRef<'_>,
        keys: TensorRef<'_>,
        values: TensorRef<'_>,
        scale: f32,
        mask: MaskRef<'_>,
    ) -> PResult<ROption<Tensor>> {
        let _ = (queries, keys, values, scale, mask);
        abi_stable::std_types::RResult::ROk(ROption::RNone)
    }

    // --- v2.3: appended after the prefix.

    /// For a layout that keeps K/V in a pool of blocks shared by its caches
    /// (`--paged-kv`): what the pool holds now, across every cache of the
    /// plugin (all layers, rows, joiners). Others answer `RNone` (the
    /// default). The host reports it (`/stats`); tests measure sharing by it.
    fn pool_usage(&self) -> ROption<PoolUsage> {
        ROption::RNone
    }

    // --- v2.5: appended after the prefix.

    /// Row `row`'s keys and values as attention reads them, oldest first,
    /// without its padding or holes, for a drafter to read (`TargetKv`):
    /// slices (or, where a row's columns are not contiguous, a gather) of
    /// the layout's storage, never written by it. A layout advertising
    /// `kv-view:<scheme>` lends them in that scheme; others decline (the
    /// default: an error saying so).
    fn kv_view(&self, row: u32) -> PResult<KvView> {
        let _ = row;
        abi_stable::std_types::RResult::RErr(crate::error::PluginError::unsupported(
            "this cache layout lends no K/V views",
        ))
    }

    // --- v2.6: appended after the prefix.

    /// A snapshot layout (`caps::SPEC_REPLAY`) inside a speculative round:
    /// whether the graph's next update should also hand it the state after
    /// each of the update's positions (`set_position_states`), so that a
    /// rollback keeps any count by picking that position's state instead of
    /// restoring the round's start for the host to replay the kept tokens.
    /// Others answer false (the default).
    fn wants_position_states(&self) -> bool {
        false
    }

    /// The states of slot `i` after each position of the update just made,
    /// `[B, L, ..slot shape]` (a padded column's is the state it kept), when
    /// `wants_position_states` asked for them. The default refuses.
    fn set_position_states(&mut self, i: u32, states: Tensor) -> PResult<()> {
        let _ = (i, states);
        abi_stable::std_types::RResult::RErr(crate::error::PluginError::unsupported(
            "this cache layout keeps no per-position states",
        ))
    }

    /// A snapshot layout: whether a `spec_rollback` now keeps any count by
    /// itself (it holds the position states of the round's update), so the
    /// host need not replay. False by default: the host replays.
    fn rolls_back_in_place(&self) -> bool {
        false
    }

    // --- v2.8: appended after the prefix.

    /// `update_and_fetch` for a graph about to attend with `queries`
    /// (`[B, H_q, L, D]`, transferred): the K/V to attend over and the
    /// queries to attend with. MLX orders kernels by the arrays they
    /// produce, so a layout that writes its storage in place (a kernel
    /// writing into an input, which MLX cannot see) passes the queries
    /// through that kernel: the attention then runs after the write
    /// (`KvQueries::written_in_place` says what else to order). The
    /// default stores with `update_and_fetch` and hands `queries` back.
    fn update_for_queries(&mut self, queries: Tensor, keys: Tensor, values: Tensor) -> PResult<KvQueries> {
        match self.update_and_fetch(keys, values) {
            abi_stable::std_types::RResult::ROk(kv) => abi_stable::std_types::RResult::ROk(KvQueries {
                queries,
                keys: kv.keys,
                values: kv.values,
                written_in_place: false,
            }),
            abi_stable::std_types::RResult::RErr(e) => abi_stable::std_types::RResult::RErr(e),
        }
    }
}

/// What [`CacheLayout::update_for_queries`] returns: everything to attend
/// over and the queries to attend with, owned by the caller.
#[repr(C)]
#[derive(StableAbi)]
pub struct KvQueries {
    pub queries: Tensor,
    pub keys: Tensor,
    pub values: Tensor,
    /// The layout wrote the new K/V in place, unseen by MLX: only kernels
    /// that take `queries` are ordered after the write, so a graph that
    /// reads `keys`/`values` in any other kernel first (a copy, a padding,
    /// a matmul's staging) schedules `queries` (`async_eval`) before it.
    pub written_in_place: bool,
}

/// One row's K/V (`CacheLayout::kv_view`): `[1, H, L, D]` each, column
/// `j` at position `first + j`.
#[repr(C)]
#[derive(StableAbi)]
pub struct KvView {
    pub keys: Tensor,
    pub values: Tensor,
    pub first: u64,
}

/// A block pool's counts ([`CacheLayout::pool_usage`]).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// Tokens per block.
    pub block_tokens: u32,
    /// Distinct blocks alive (each one copy of its K/V).
    pub blocks: u64,
    /// Block-table entries referring to them (a shared block counts once
    /// per holder): `references / blocks` is the sharing factor.
    pub references: u64,
    /// Bytes the distinct blocks hold.
    pub bytes: u64,
    /// Tokens held outside blocks: each row's partly filled last block,
    /// private to that row.
    pub tail_tokens: u64,
}

/// A cache layout behind the boundary.
pub type CacheBox = CacheLayout_TO<'static, RBox<()>>;
