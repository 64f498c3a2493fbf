//! Draft providers for speculative decoding.
//!
//! Protocol, per request: `prefill(prompt)` once; then each round
//! `draft(history, max)` proposes up to `max` tokens continuing `history`
//! (the whole sequence so far, its last token not yet verified); the host
//! verifies them in one target forward and calls `commit(accepted)`. The
//! token the target then emits (correction or bonus) arrives at the end of
//! the next round's `history`. The returned length is authoritative: 0 means
//! "take a plain step this round".
//!
//! Drafters that read the target's states (MTP, block drafters) say what
//! they need once, in `target_wants`; the host then asks the target's
//! forward passes for it and hands it over: the prompt's in
//! `prefill_states` (instead of `prefill`), each verify's in
//! `commit_states` (instead of `commit`, and after every verify, also one
//! of 0 drafts). Those three are appended after the prefix (ABI 2.1): a
//! drafter that does not override them keeps the plain protocol.
//!
//! Drafters that attend the target's own keys and values (Gemma 4's
//! assistant heads) name the layers in `target_kv`, by role or index; the
//! host resolves them against the target's plan once, and at every round
//! lends the row's K/V of those layers to `draft_kv` (instead of `draft`)
//! as read-only views the cache layouts make (ABI 2.5).
//!
//! Pipelined rounds (ABI 2.7): on a greedy serial request whose cache
//! layouts let rounds overlap (`caps::SPEC_PIPELINE`), the host asks a
//! drafter that reads target states for the NEXT round's drafts
//! (`draft_ahead`) while the current verify is still on the device, as if
//! it accepts every draft, and queues that round's verify behind it. A
//! verdict that falls short drops the queued round (caches and drafter).

use crate::cache::CacheBox;
use crate::error::PResult;
use crate::layer_need::{LayerNeed, NeedKind};
use crate::model::{ModelBox, ModelPlan};
use crate::tensor::{Tensor, TensorRef};
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, ROption, RSlice, RStr, RString, RVec, Tuple2};
use abi_stable::StableAbi;

/// How sure `detect_draft` is that a folder is its plugin's artifact. The
/// host takes the most confident plugin, so these levels order detection
/// the way the ancestor did: a file only that kind has (`dspark.json`) over
/// an architecture name (`Gemma4DSparkModel`) over a model type
/// (`*assistant*`, `*_mtp`) over "any model folder" (two-model, the
/// fallback). 0 = not mine.
pub mod detect {
    pub const DEDICATED_FILE: u32 = 100;
    pub const ARCHITECTURE: u32 = 80;
    pub const MODEL_TYPE: u32 = 60;
    pub const ANY_MODEL: u32 = 1;
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct DrafterOpenArgs {
    /// The draft kind the host resolved (`ngram`, `two-model`, ...).
    pub kind: RString,
    /// The draft artifact folder, when the kind has one.
    pub dir: ROption<RString>,
    /// Its config.json text, when present.
    pub config_json: ROption<RString>,
    /// Upper bound on tokens per round.
    pub max_depth: u32,
    /// Kind-specific options (`ngram-max=3`, ...).
    pub options: RVec<Tuple2<RString, RString>>,
}

#[repr(C)]
#[derive(StableAbi)]
pub struct DraftArgs<'a> {
    pub history: RSlice<'a, u32>,
    pub max_tokens: u32,
    /// How the request samples, so a drafter can draft from q close to the
    /// target's p (rejection sampling accepts more the closer they are).
    pub sampling: DraftSampling,
}

/// The request's sampling parameters, with the meaning the host gives
/// them: log-probabilities filtered by top-p, then min-p, then top-k, then
/// scaled by `1/temperature`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq)]
pub struct DraftSampling {
    /// 0 = greedy (draft the argmax, return no probabilities).
    pub temperature: f32,
    /// In (0, 1) to filter; 1 (or 0) = off.
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 0 = off.
    pub min_p: f32,
    /// Seeds the drafter's own draws this round: a fresh value every round,
    /// the same values for the same request seed. Independent of the
    /// host's draws (the accept test needs drafts independent of them).
    pub seed: u64,
}

impl DraftSampling {
    pub const GREEDY: Self = Self { temperature: 0.0, top_p: 1.0, top_k: 0, min_p: 0.0, seed: 0 };

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

#[repr(C)]
#[derive(StableAbi)]
pub struct Draft {
    pub tokens: RVec<u32>,
    /// float32 `[n, V]` rows: row i is the normalised distribution q that
    /// token i was drawn from, when the drafter sampled (temperature > 0;
    /// advertise `caps::DRAFT_PROBABILITIES`). The host then verifies by
    /// rejection sampling; without them, by exact match of its own samples.
    pub probabilities: ROption<Tensor>,
}

/// Which of the target's states a drafter reads (`Drafter::target_wants`).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetWants {
    /// The final hidden states, after the target's final norm (`[1, L, H]`).
    pub hidden: bool,
    /// Hidden taps: the residual stream after these decoder layers, before
    /// the final norm (`ForwardArgs::taps`; the target must advertise
    /// `caps::HIDDEN_TAPS`).
    pub taps: RVec<u32>,
}

impl TargetWants {
    pub fn any(&self) -> bool {
        self.hidden || !self.taps.is_empty()
    }
}

/// The target's states over consecutive positions, lent for one call (a
/// drafter that keeps one makes its own reference, `TensorRef::to_owned`).
#[repr(C)]
#[derive(StableAbi)]
pub struct TargetStates<'a> {
    /// The sequence position of the first row.
    pub first: u64,
    /// Rows covered (the `L` of every tensor below; may be 0).
    pub len: u64,
    /// `[1, L, H]` after the final norm, when `TargetWants::hidden`.
    pub hidden: ROption<TensorRef<'a>>,
    /// One `[1, L, H]` per `TargetWants::taps` entry, in that order.
    pub taps: RSlice<'a, TensorRef<'a>>,
}

/// How a drafter names a target layer whose K/V it reads: by its role
/// among the target's cached attention layers (the plan's `layers`, in
/// forward order), or by its index there.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRole(pub u8);

impl KvRole {
    /// The last plan layer of kind `FULL`.
    pub const LAST_FULL: Self = Self(1);
    /// The last plan layer of kind `SLIDING`.
    pub const LAST_SLIDING: Self = Self(2);
    /// The plan layer `KvPick::index`.
    pub const INDEX: Self = Self(3);

    pub fn name(self) -> &'static str {
        match self {
            Self::LAST_FULL => "the last full-attention layer",
            Self::LAST_SLIDING => "the last sliding-window layer",
            Self::INDEX => "a layer by index",
            _ => "an unknown role",
        }
    }
}

/// One target layer a drafter reads K/V from (`Drafter::target_kv`).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPick {
    pub role: KvRole,
    /// The plan layer, for `KvRole::INDEX` (ignored otherwise).
    pub index: u32,
}

/// One target layer's K/V as lent to `draft_kv` for one round: one row's
/// keys and values after the target's norms and RoPE, exactly as its
/// attention reads them, oldest first. Column `j` holds position
/// `first + j`; every column is a token of this row (no padding, no
/// holes), so it needs no mask of the layout's. A sliding layer's view
/// holds at least the last `window` positions (or all, when fewer); which
/// of them a query sees is the drafter's rule.
#[repr(C)]
#[derive(StableAbi)]
pub struct TargetKv<'a> {
    /// The plan layer the pick resolved to.
    pub layer: u32,
    pub kind: NeedKind,
    /// The sliding window (SLIDING; 0 otherwise).
    pub window: u32,
    /// `[1, H_kv, L, D_k]` and `[1, H_kv, L, D_v]` (L is 0 for a row that
    /// holds no tokens yet: a one-token prompt before its first verify).
    pub keys: TensorRef<'a>,
    pub values: TensorRef<'a>,
    pub first: u64,
}

#[sabi_trait]
pub trait Drafter: Send {
    fn prefill(&mut self, prompt: RSlice<'_, u32>) -> PResult<()>;
    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft>;
    #[sabi(last_prefix_field)]
    fn commit(&mut self, accepted: u32) -> PResult<()>;

    /// The target states this drafter reads; asked once after opening.
    /// Nothing by default (the plain protocol).
    fn target_wants(&self) -> TargetWants {
        TargetWants::default()
    }

    /// `prefill` with the target's states over the prompt positions the
    /// host ran (`states.first..states.first + states.len`, all but the
    /// last prompt token; positions before `first` came from the prefix
    /// cache and have no states). Called instead of `prefill` when
    /// `target_wants` asks for anything.
    fn prefill_states(&mut self, prompt: RSlice<'_, u32>, states: TargetStates<'_>) -> PResult<()> {
        let _ = states;
        self.prefill(prompt)
    }

    /// `commit` with the target's states at the verified positions: row 0
    /// is the round's pending token, row i the i-th draft (`states.len` =
    /// drafts + 1; rows past `accepted` belong to rejected drafts). Called
    /// after every verify, a round of 0 drafts included (in a batch also a
    /// verify whose step did not ask this drafter to draft: `len` 1), instead
    /// of `commit` when `target_wants` asks for anything.
    fn commit_states(&mut self, accepted: u32, states: TargetStates<'_>) -> PResult<()> {
        let _ = states;
        self.commit(accepted)
    }

    // --- v2.5: appended after the prefix.

    /// The target layers whose K/V this drafter reads, in the order
    /// `draft_kv` receives them; asked once after opening. None by default.
    /// The host refuses to start when a pick resolves to no layer or the
    /// layer's cache layout lends no views in its scheme (`caps::KV_VIEW_PREFIX`).
    fn target_kv(&self) -> RVec<KvPick> {
        RVec::new()
    }

    /// `draft` with this row's K/V of the `target_kv` layers (one view per
    /// pick, in order), as the target's caches hold them when the round
    /// starts: every verified token, the pending one not yet. Called
    /// instead of `draft` when `target_kv` names any layer.
    fn draft_kv(&mut self, args: DraftArgs<'_>, kv: RSlice<'_, TargetKv<'_>>) -> PResult<Draft> {
        let _ = kv;
        self.draft(args)
    }

    // --- v2.7: appended after the prefix.

    /// Pipelined rounds (greedy, serial): drafts the round AFTER the one
    /// being verified, before its verdict is read, as if it accepts every
    /// draft. `args.pending` is that verify's bonus token, still on the
    /// device; `args.states` its states, as `commit_states` will receive
    /// them. Returns the drafts as uint32 `[n]` on the device (unread), or
    /// `RNone` to decline, having changed nothing (the default).
    ///
    /// The next `commit_states` settles the round being verified: if it
    /// accepts every draft, the round drafted here becomes the current one
    /// (its own verify's `commit_states` follows); otherwise the drafter
    /// forgets it. Only drafters that read target states are asked.
    fn draft_ahead(&mut self, args: AheadArgs<'_>) -> PResult<ROption<Tensor>> {
        let _ = args;
        PResult::ROk(ROption::RNone)
    }
}

/// What `Drafter::draft_ahead` drafts from (v2.7).
#[repr(C)]
#[derive(StableAbi)]
pub struct AheadArgs<'a> {
    /// The history's length once the round being verified accepts every
    /// draft, `pending` included (its drafts may not have been read yet).
    pub history_len: u64,
    /// uint32 `[1]`: the verify's bonus token, not read yet.
    pub pending: TensorRef<'a>,
    pub max_tokens: u32,
    pub sampling: DraftSampling,
    /// The verify's states (row 0 the round's pending token, row i its
    /// i-th draft).
    pub states: TargetStates<'a>,
}

pub type DrafterBox = Drafter_TO<'static, RBox<()>>;

/// A model composed by the host (graph + one cache per layer).
#[repr(C)]
#[derive(StableAbi)]
pub struct ModelInstance {
    pub graph: ModelBox,
    pub caches: RVec<CacheBox>,
}

/// What the host lends a drafter: other plugins through the host's
/// composition, and the target's shared weights.
#[sabi_trait]
pub trait HostServices: Send + Sync {
    /// Opens a model folder with whatever family plugin claims it, with
    /// fresh serial caches from the cache-layout plugins.
    fn open_model(&self, dir: RStr<'_>) -> PResult<ModelInstance>;
    /// The target's embeddings for int32 ids `[B, L]`.
    fn target_embed(&self, tokens: TensorRef<'_>) -> PResult<Tensor>;
    /// The target's LM head over hidden states.
    #[sabi(last_prefix_field)]
    fn target_lm_head(&self, hidden: TensorRef<'_>) -> PResult<Tensor>;

    /// The target's plan (hidden size, vocabulary, layers), so a drafter
    /// can refuse a target it does not fit.
    fn target_plan(&self) -> PResult<ModelPlan> {
        PResult::RErr(crate::PluginError::unsupported("this host lends no target plan"))
    }

    /// The target's model folder (drafters whose weights may sit inside
    /// the target's checkpoint).
    fn target_dir(&self) -> PResult<RString> {
        PResult::RErr(crate::PluginError::unsupported("this host lends no target folder"))
    }

    /// A fresh serial cache for one layer of the drafter's own, from the
    /// cache-layout plugins, in the target's cache dtype and scheme `plain`.
    fn new_cache(&self, need: &LayerNeed) -> PResult<CacheBox> {
        let _ = need;
        PResult::RErr(crate::PluginError::unsupported("this host lends no caches"))
    }

    /// The dtype the target computes in (its activations, embeddings and
    /// caches), so a drafter that reads its states loads its own weights to
    /// match (v2.4).
    fn target_dtype(&self) -> PResult<crate::Dtype> {
        PResult::RErr(crate::PluginError::unsupported("this host lends no target dtype"))
    }
}

pub type HostServicesBox = HostServices_TO<'static, RBox<()>>;
