//! Drafter `draft-mtp` (kind `mtp`): Qwen3.5 multi-token prediction. The
//! head (`head.rs`) reads the target's hidden states after its final norm
//! (`Drafter::target_wants`), the target's embedding and LM head
//! (`HostServices`), and keeps one KV cache of its own per layer (from the
//! cache-layout plugins, `HostServices::new_cache`). The round loop and
//! cache maintenance follow mlx-vlm 0.7.10's `_mtp_rounds` (`rounds.rs`).
//! Heads are read in mlx-vlm's and Hugging Face's layouts (`source.rs`) or
//! speculators' (`speculators.rs`).

use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::*;
use plugin_sdk::rstrings;
use std::path::Path;

mod head;
mod open;
mod rounds;
mod source;
mod speculators;

plugin_sdk::export_plugin! {
    manifest: manifest,
    detect_draft: detect,
    open_drafter: open_drafter,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::DRAFTER,
        "Qwen3.5 multi-token prediction: the target's own MTP head drafting from its hidden states",
        Claims { draft_kinds: rstrings(&["mtp"]), ..Default::default() },
        &["default-depth:2", caps::DRAFT_PROBABILITIES],
    )
}

/// A `*_mtp` folder, a model folder with an `mtp/` folder, or a checkpoint
/// holding `mtp.*` tensors: a model type's confidence (over two-model's
/// "any model folder"); speculators' `speculators_model_type: "mtp"` names
/// the kind as surely as an architecture name.
fn detect(dir: &str, _config: &str) -> u32 {
    match source::locate(Path::new(dir)) {
        Some(s) if s.speculators => detect::ARCHITECTURE,
        Some(_) => detect::MODEL_TYPE,
        None => 0,
    }
}

fn open_drafter(args: &DrafterOpenArgs, host: HostServicesBox) -> Result<DrafterBox, PluginError> {
    let d = open::open(args, host)?;
    Ok(Drafter_TO::from_value(d, TD_Opaque))
}
