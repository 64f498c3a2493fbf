//! Drafter `toy-drafter`: draft kind `toy-repeat`, written against
//! plugin-api alone, out of tree. Its artifact is a folder whose config.json
//! has `"model_type": "toy-repeat-draft"`; each round it proposes the last
//! token of the history again, `max_tokens` times (at most `max_depth`).
//!
//! It also reads a hidden tap (the target's layer 0, `target_wants`), to
//! show the target-states protocol: the host lends the prompt's states in
//! `prefill_states` and each verify's in `commit_states`; this drafter
//! checks that they sit where the protocol says (the verify's first row at
//! the pending token's position, one row per verified token, the target's
//! hidden width) and fails the round loudly if not. And it reads the K/V
//! of the target's last full-attention layer (`target_kv`, plugin-api
//! 2.5): each round's view must hold every verified token of the row, from
//! position 0, the pending one not yet (`draft_kv`).

use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RVec};
use plugin_api::*;
use plugin_sdk::{guard, rstrings};

pub const DRAFT_KIND: &str = "toy-repeat";
pub const ARTIFACT_MODEL_TYPE: &str = "toy-repeat-draft";

plugin_sdk::export_plugin! {
    manifest: manifest,
    detect_draft: detect_draft,
    open_drafter: open_drafter,
}

fn manifest() -> PluginManifest {
    PluginManifest {
        name: "toy-drafter".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        abi_version: ABI_VERSION,
        kind: PluginKind::DRAFTER,
        description: "repeats the last token (third-party proof of the plugin ABI)".into(),
        claims: Claims { draft_kinds: rstrings(&[DRAFT_KIND]), ..Default::default() },
        // Its artifact is a folder (`--draft-model`); no probability rows.
        capabilities: rstrings(&[caps::NEEDS_DRAFT_MODEL]),
        extra: RVec::new(),
    }
}

fn model_type(config_json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(config_json).ok()?;
    v.get("model_type")?.as_str().map(str::to_owned)
}

/// How sure this is toy-repeat's artifact, on the `plugin_api::detect`
/// scale; 0 = not mine. The SDK wraps this entry in `catch_unwind` (a panic
/// reads as 0).
fn detect_draft(_dir: &str, config_json: &str) -> u32 {
    match model_type(config_json) {
        // A model type only this kind uses.
        Some(t) if t == ARTIFACT_MODEL_TYPE => detect::MODEL_TYPE,
        _ => 0,
    }
}

fn open_drafter(args: &DrafterOpenArgs, host: HostServicesBox) -> Result<DrafterBox, PluginError> {
    if args.kind.as_str() != DRAFT_KIND {
        return Err(PluginError::unsupported(format!("toy-drafter implements `{DRAFT_KIND}`, not `{}`", args.kind)));
    }
    if let ROption::RSome(text) = &args.config_json {
        match model_type(text) {
            Some(t) if t == ARTIFACT_MODEL_TYPE => {}
            other => {
                return Err(PluginError::invalid_config(format!(
                    "config.json: model_type must be `{ARTIFACT_MODEL_TYPE}`, got {other:?}"
                )))
            }
        }
    }
    // Options come from `--draft-option key=value` as they were typed: refuse
    // what is not yours rather than ignore a typo.
    if let Some(kv) = args.options.first() {
        return Err(PluginError::invalid_input(format!("toy-repeat takes no options, got `{}`", kv.0)));
    }
    if args.max_depth == 0 {
        return Err(PluginError::invalid_input("max_depth must be at least 1"));
    }
    // The target's width, to check the taps against (a host may lend no
    // plan). `host` is dropped here, handed back through its own vtable.
    let hidden = host.target_plan().into_result().ok().map(|p| p.hidden_size as i32);
    let repeat = Repeat { max_depth: args.max_depth, prompt_len: 0, drafted: 0, pending_at: None, hidden };
    Ok(Drafter_TO::from_value(repeat, TD_Opaque))
}

struct Repeat {
    max_depth: u32,
    prompt_len: usize,
    /// Tokens proposed in the current round (commit may accept at most these).
    drafted: u32,
    /// Where the next verify's states must start: the pending token's
    /// position (None before the prompt's states).
    pending_at: Option<u64>,
    /// The target's hidden size, when the host lent its plan.
    hidden: Option<i32>,
}

impl Repeat {
    /// The lent tap is `[1, len, H]` and starts where it should.
    fn check_states(&self, states: &TargetStates<'_>, first: u64) -> Result<(), PluginError> {
        if states.first != first {
            return Err(PluginError::invalid_input(format!(
                "the host lent states from position {}, expected {first}",
                states.first
            )));
        }
        if states.len == 0 {
            return Ok(()); // nothing ran: no tensors lent
        }
        let [tap] = states.taps.as_slice() else {
            return Err(PluginError::invalid_input(format!("asked for 1 tap, lent {}", states.taps.len())));
        };
        let shape = plugin_sdk::view(*tap).shape().to_vec();
        let width = self.hidden.unwrap_or(shape[2]);
        if shape != [1, states.len as i32, width] {
            return Err(PluginError::invalid_input(format!(
                "tap of shape {shape:?} for {} positions of width {width}",
                states.len
            )));
        }
        Ok(())
    }
}

impl Drafter for Repeat {
    fn prefill(&mut self, prompt: RSlice<'_, u32>) -> PResult<()> {
        guard(|| {
            self.prompt_len = prompt.len();
            self.drafted = 0;
            Ok(())
        })
    }

    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft> {
        guard(|| {
            #[cfg(feature = "faults")]
            faults::on_history(args.history.as_slice());
            // An empty history has nothing to repeat: 0 tokens = a plain step.
            let n = match args.history.last() {
                Some(_) => args.max_tokens.min(self.max_depth),
                None => 0,
            };
            let last = args.history.last().copied().unwrap_or(0);
            self.drafted = n;
            // Positions the host ran as plain steps bring no states (a gap
            // the protocol allows): the pending token is the history's last.
            self.pending_at = args.history.len().checked_sub(1).map(|p| p as u64);
            Ok(Draft { tokens: RVec::from(vec![last; n as usize]), probabilities: ROption::RNone })
        })
    }

    fn commit(&mut self, accepted: u32) -> PResult<()> {
        guard(|| {
            if accepted > self.drafted {
                return Err(PluginError::invalid_input(format!(
                    "commit({accepted}) after drafting {} tokens",
                    self.drafted
                )));
            }
            self.drafted = 0;
            Ok(())
        })
    }

    fn target_kv(&self) -> RVec<KvPick> {
        RVec::from(vec![KvPick { role: KvRole::LAST_FULL, index: 0 }])
    }

    fn draft_kv(&mut self, args: DraftArgs<'_>, kv: RSlice<'_, TargetKv<'_>>) -> PResult<Draft> {
        guard(|| {
            let [view] = kv.as_slice() else {
                return Err(PluginError::invalid_input(format!("asked for 1 K/V view, lent {}", kv.len())));
            };
            let (keys, values) =
                (plugin_sdk::view(view.keys).shape().to_vec(), plugin_sdk::view(view.values).shape().to_vec());
            let verified = args.history.len().saturating_sub(1) as i32;
            if keys.len() != 4 || keys[0] != 1 || keys[2] != verified || values[2] != verified || view.first != 0 {
                return Err(PluginError::invalid_input(format!(
                    "K/V view of shape {keys:?} from position {} for {verified} verified tokens",
                    view.first
                )));
            }
            self.draft(args).into_result()
        })
    }

    fn target_wants(&self) -> TargetWants {
        TargetWants { hidden: false, taps: RVec::from(vec![0]) }
    }

    fn prefill_states(&mut self, prompt: RSlice<'_, u32>, states: TargetStates<'_>) -> PResult<()> {
        guard(|| {
            self.prefill(prompt).into_result()?;
            // All but the last prompt token, after what the prefix cache served.
            if states.first + states.len != prompt.len() as u64 - 1 {
                return Err(PluginError::invalid_input(format!(
                    "prompt states cover {}..{}, the prompt has {} tokens",
                    states.first,
                    states.first + states.len,
                    prompt.len()
                )));
            }
            self.check_states(&states, states.first)?;
            self.pending_at = Some(states.first + states.len);
            Ok(())
        })
    }

    fn commit_states(&mut self, accepted: u32, states: TargetStates<'_>) -> PResult<()> {
        guard(|| {
            // (A batch row may be verified without having drafted: 0 drafts.)
            let drafted = self.drafted;
            self.commit(accepted).into_result()?;
            if states.len != u64::from(drafted) + 1 {
                return Err(PluginError::invalid_input(format!("{} verified rows for {drafted} drafts", states.len)));
            }
            self.check_states(&states, self.pending_at.unwrap_or(states.first))?;
            self.pending_at = Some(states.first + u64::from(accepted) + 1);
            Ok(())
        })
    }
}

/// The `faults` variant: what a broken drafter does to the process that
/// runs it, on purpose, when the history ends with 21 (panics), 20 (aborts)
/// or 22 (writes through a wild pointer).
#[cfg(feature = "faults")]
mod faults {
    pub fn on_history(history: &[u32]) {
        match history.last() {
            Some(21) => panic!("toy-drafter panics on a history ending with 21 (built with feature faults)"),
            Some(20) => std::process::abort(),
            // SAFETY: none; this variant exists to crash its process.
            Some(22) => unsafe { std::ptr::write_volatile(std::ptr::without_provenance_mut::<u8>(16), 1) },
            _ => {}
        }
    }
}
