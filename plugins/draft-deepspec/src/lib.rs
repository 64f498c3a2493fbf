//! Drafter `draft-deepspec` (kind `deepspec`): the `Gemma4DSparkModel`
//! release, mlx-vlm's `gemma4_dspark`. A DSpark block drafter whose layers
//! are Gemma 4's (sandwich norms, GeGLU, keys and values from one
//! projection at `global_head_dim`, unit attention scale), with its own
//! embedding and LM head and soft-capped logits; its config is flat. The
//! network and the round loop are the `block-drafter` crate's.

use plugin_api::*;
use plugin_sdk::rstrings;

plugin_sdk::export_plugin! {
    manifest: manifest,
    detect_draft: detect,
    open_drafter: open_drafter,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::DRAFTER,
        "DeepSpec (Gemma4DSparkModel): a DSpark block over the target's hidden taps, Gemma 4 layers, its own vocabulary head",
        Claims { draft_kinds: rstrings(&["deepspec"]), ..Default::default() },
        // The release's block of 7 proposals (verify width 8).
        &["default-depth:7", caps::FIXED_DEPTH, caps::DRAFT_PROBABILITIES],
    )
}

/// The release names its architecture; its model type is Gemma 4's own.
fn detect(_dir: &str, config: &str) -> u32 {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(config) else { return 0 };
    match v["architectures"].as_array().is_some_and(|a| a.iter().any(|x| x == "Gemma4DSparkModel")) {
        true => detect::ARCHITECTURE,
        false => 0,
    }
}

fn open_drafter(args: &DrafterOpenArgs, host: HostServicesBox) -> Result<DrafterBox, PluginError> {
    block_drafter::open_drafter(args, host, block_drafter::Layout::DeepSpec)
}
