//! Drafter `toy-drafter`: draft kind `toy-repeat`, written against
//! plugin-api alone, out of tree. Its artifact is a folder whose config.json
//! has `"model_type": "toy-repeat-draft"`; each round it proposes the last
//! token of the history again, `max_tokens` times (at most `max_depth`).

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

fn open_drafter(args: &DrafterOpenArgs, _host: HostServicesBox) -> Result<DrafterBox, PluginError> {
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
    // `_host` (the target's services) is not needed: dropping it here hands
    // it back through its own vtable.
    Ok(Drafter_TO::from_value(Repeat { max_depth: args.max_depth, prompt_len: 0, drafted: 0 }, TD_Opaque))
}

struct Repeat {
    max_depth: u32,
    prompt_len: usize,
    /// Tokens proposed in the current round (commit may accept at most these).
    drafted: u32,
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
