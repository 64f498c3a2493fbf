//! Drafter `draft-assistant` (kind `assistant`): Gemma 4 `*-assistant`
//! heads. The head (`net.rs`, `head.rs`) reads the target's hidden state
//! after its final norm (`Drafter::target_wants`), its embedding
//! (`HostServices::target_embed`) and, through `Drafter::target_kv`, the
//! K/V of the target's last sliding and last full attention layer, which
//! its query-only layers attend; it keeps no cache. The round loop follows
//! mlx-vlm 0.7.10's `_mtp_rounds` over `Gemma4AssistantDraftModel`
//! (`rounds.rs`, which also says which query position it uses).

use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::*;
use plugin_sdk::rstrings;

mod config;
mod head;
mod net;
mod open;
mod rounds;

plugin_sdk::export_plugin! {
    manifest: manifest,
    detect_draft: detect,
    open_drafter: open_drafter,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::DRAFTER,
        "Gemma 4 assistant heads: query-only layers over the target's own K/V",
        Claims { draft_kinds: rstrings(&["assistant"]), ..Default::default() },
        // mlx-vlm drafts `block_size - 1` (3 by default) every round.
        &["default-depth:3", caps::FIXED_DEPTH, caps::DRAFT_PROBABILITIES],
    )
}

/// A `model_type` containing "assistant" (`gemma4_assistant`).
fn detect(_dir: &str, config: &str) -> u32 {
    let v: serde_json::Value = serde_json::from_str(config).unwrap_or_default();
    match v.get("model_type").and_then(serde_json::Value::as_str) {
        Some(t) if t.contains("assistant") => detect::MODEL_TYPE,
        _ => 0,
    }
}

fn open_drafter(args: &DrafterOpenArgs, host: HostServicesBox) -> Result<DrafterBox, PluginError> {
    let d = open::open(args, host)?;
    Ok(Drafter_TO::from_value(d, TD_Opaque))
}
