//! Capability tags a plugin advertises in its manifest.
//!
//! Tags are strings so that v1.x can add new ones without a layout change; a
//! host ignores tags it does not know (and lists them). The host composes
//! plugins by these tags, never by plugin or family name.

// --- model families ---
/// Rows of different requests can share one forward (continuous batching):
/// the graph accepts per-row RoPE offsets and explicit masks from the caches.
pub const CONTINUOUS_BATCHING: &str = "continuous-batching";
/// `grouped:<method>`: that inference method may run inside a batch group.
pub const GROUPED_PREFIX: &str = "grouped:";
/// `grouped:speculative`: speculative rounds may run inside a batch group (a
/// `[B, k+1]` verify over batched caches; docs/plugin-guide.md).
pub const GROUPED_SPECULATIVE: &str = "grouped:speculative";
/// Forward can return hidden-state taps at requested layers.
pub const HIDDEN_TAPS: &str = "hidden-taps";
/// `embed` and `lm_head` are available to drafters that share them.
pub const SHARED_EMBEDDINGS: &str = "shared-embeddings";
/// Every attention layer attends through `CacheLayout::attend` first (model-kit's
/// `attention::attend`), so a layout may attend itself: needed by schemes
/// whose K/V plain attention cannot read (`--kv-quant`). Implies that
/// batching works over those schemes wherever their layouts have `rows`.
pub const LAYOUT_ATTENTION: &str = "layout-attention";
/// Batching works with quantized KV layouts.
pub const QUANTIZED_KV_BATCH: &str = "quantized-kv-batch";
/// Generation checkpoints (resumable state) are supported.
pub const CHECKPOINTS: &str = "checkpoints";
/// A compiled decode step is available.
pub const COMPILED_DECODE: &str = "compiled-decode";
/// The family splits its graph over the ranks of MLX's process group when
/// the host passes the model option `tensor-parallel=<ranks>` (model-kit's
/// `shard`): attention and KV heads, MLP channels and expert channels per
/// rank; its caches then hold `kv_heads / ranks` heads (v2.3).
pub const TENSOR_PARALLEL: &str = "tensor-parallel";
/// The model option (`ModelOpenArgs.options`) that carries the number of
/// ranks to a family advertising [`TENSOR_PARALLEL`] (v2.3).
pub const TENSOR_PARALLEL_OPTION: &str = "tensor-parallel";
/// Continuous (grouped) rows can be checkpointed, not only serial runs.
pub const SHARED_CHECKPOINTS: &str = "shared-checkpoints";

// --- cache layouts ---
/// `trim(n)` removes the last n tokens (rollback by trim).
pub const TRIM: &str = "trim";
/// begin/commit/rollback of a speculative round are implemented.
pub const SPEC_ROUND: &str = "spec-round";
/// Rollback restores the snapshot taken at `spec_begin` instead of trimming
/// (recurrent state): after `spec_rollback(keep)` the layout's offset is back
/// at the round's start and the host replays the kept tokens through the
/// model (snapshot and replay). Trimming layouts end at `start + keep`.
/// With one count per row, the host replays every row in one forward of
/// `max(keep)` columns: the layout's next update treats columns past
/// `keep[r]` as row r's padding (`attention_mask`) and advances row r by
/// `keep[r]` (docs/plugin-guide.md).
pub const SPEC_REPLAY: &str = "spec-replay";
/// Rounds may overlap (v2.7): `spec_begin` while rounds are open opens a
/// younger one; `spec_commit` settles the OLDEST open round;
/// `spec_rollback(keep)` keeps `keep` tokens of the oldest and drops the
/// rest, every younger round included. The host then queues a serial
/// round before the previous one's verdict is read (pipelined rounds).
pub const SPEC_PIPELINE: &str = "spec-pipeline";
/// Row operations (merge/filter/extract/left padding) for batching.
pub const ROWS: &str = "rows";
/// `export_state` / `import_state` (prefix and disk caches).
pub const STATE_IO: &str = "state-io";
/// `update_and_fetch` hands back plain K/V in every scheme the layout
/// claims (the scheme changes where K/V are kept, not what attention
/// reads): a family that attends itself (no `layout-attention`) works over
/// it, and batches over it.
pub const PLAIN_FETCH: &str = "plain-fetch";
/// `kv-view:<scheme>`: `CacheLayout::kv_view` lends a row's plain K/V in
/// that scheme (`kv-view:plain`), so drafters may read the layer (v2.5).
pub const KV_VIEW_PREFIX: &str = "kv-view:";
/// `need:<kind>`: the layer needs this layout serves (full, sliding, recurrent).
pub const NEED_PREFIX: &str = "need:";
/// `scheme:<name>`: a storage scheme this layout implements (`plain`,
/// `affine8`, `affine4`); `CacheSpec.scheme` names it, with parameters after a `:`.
pub const SCHEME_PREFIX: &str = "scheme:";

// --- drafters ---
/// Drafts come with the drafter's probability rows (rejection sampling).
pub const DRAFT_PROBABILITIES: &str = "draft-probabilities";
/// `default-depth:<n>`: the tokens per round the drafter drafts when the
/// user gives no `--num-draft-tokens` (the host's default: 3).
pub const DEFAULT_DEPTH_PREFIX: &str = "default-depth:";
/// Every round drafts as many tokens as the host allows: the host keeps
/// asking its full depth instead of adapting it to the last acceptance (a
/// block drafter proposes its whole block in one forward whatever the
/// count, and its drafts depend on the block's width).
pub const FIXED_DEPTH: &str = "fixed-depth";
/// The drafter needs a draft model folder (`--draft-model`).
pub const NEEDS_DRAFT_MODEL: &str = "needs-draft-model";
/// The drafter borrows the target's embeddings/LM head/taps.
pub const NEEDS_TARGET: &str = "needs-target";
/// Drafts are a function of the history passed in (no per-request state):
/// one drafter instance serves every row of a batch (speculation inside
/// continuous batching).
pub const HISTORY_ONLY: &str = "history-only";
