//! Drafter `draft-dspark` (kinds `dspark`, `dflash`): mlx-vlm's block
//! drafters in its `dflash_config` layout or speculators' (a Qwen3-shaped
//! network over the target's hidden taps; DSpark adds the Markov and
//! confidence heads). The network and the round loop are the
//! `block-drafter` crate's.

use plugin_api::*;
use plugin_sdk::rstrings;
use std::path::Path;

plugin_sdk::export_plugin! {
    manifest: manifest,
    detect_draft: detect,
    open_drafter: open_drafter,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::DRAFTER,
        "DFlash / DSpark block drafters: one parallel block over the target's hidden taps (Markov and confidence heads for DSpark)",
        Claims { draft_kinds: rstrings(&["dspark", "dflash"]), ..Default::default() },
        // The width a config asks for caps this (a DFlash block of 16).
        &["default-depth:15", caps::FIXED_DEPTH, caps::DRAFT_PROBABILITIES],
    )
}

/// `dspark.json` is this kind's own file; speculators' config naming
/// `dflash` or `dspark` in `speculators_model_type` is as sure as an
/// architecture name; a config with a `dflash_config` (and not a DeepSpec
/// release, whose architecture another plugin claims) is a model type's
/// confidence. speculators' other algorithms (eagle3, ...; not `mtp`,
/// draft-mtp's) are claimed at that level too, so that opening refuses them
/// by name instead of a model plugin failing on a folder of draft layers.
fn detect(dir: &str, config: &str) -> u32 {
    if Path::new(dir).join("dspark.json").is_file() {
        return detect::DEDICATED_FILE;
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(config) else { return 0 };
    if let Some(kind) = v["speculators_model_type"].as_str() {
        return match kind {
            "dflash" | "dspark" => detect::ARCHITECTURE,
            "mtp" => 0,
            _ => detect::MODEL_TYPE,
        };
    }
    let deepspec = v["architectures"].as_array().is_some_and(|a| a.iter().any(|x| x == "Gemma4DSparkModel"));
    if v.get("dflash_config").is_some_and(|d| d.is_object()) && !deepspec {
        detect::MODEL_TYPE
    } else {
        0
    }
}

fn open_drafter(args: &DrafterOpenArgs, host: HostServicesBox) -> Result<DrafterBox, PluginError> {
    block_drafter::open_drafter(args, host, block_drafter::Layout::DFlash)
}
