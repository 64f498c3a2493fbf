//! Block drafters over the target's hidden taps, shared by the drafter
//! plugins of those kinds (`draft-dspark`: DFlash and DSpark;
//! `draft-deepspec`: DeepSpec). A small network (`block.rs`, Qwen3- or
//! Gemma 4-shaped) reads the target's decoder-layer outputs at
//! `target_layer_ids` (`Drafter::target_wants`) as context K/V of its own
//! cache and proposes a whole block of tokens in one forward; DSpark adds a
//! Markov head and a confidence head (`markov.rs`). The embedding and LM
//! head are the target's (through `HostServices`) or the drafter's own
//! (DeepSpec). The round loop follows mlx-vlm 0.7.10's `_dflash_rounds`
//! (`rounds.rs`). Configs are read in mlx-vlm's layouts (`config.rs`) or
//! speculators' (`speculators.rs`).

mod block;
pub mod config;
pub mod draft_vocab;
mod markov;
mod net;
mod open;
mod rounds;
pub mod speculators;

pub use config::Layout;

/// Opens a block drafter of `layout` as a plugin's `open_drafter` answers.
pub fn open_drafter(
    args: &plugin_api::DrafterOpenArgs,
    host: plugin_api::HostServicesBox,
    layout: Layout,
) -> Result<plugin_api::DrafterBox, plugin_api::PluginError> {
    use plugin_api::abi_stable::sabi_trait::TD_Opaque;
    let d = open::open(args, host, layout)?;
    Ok(plugin_api::Drafter_TO::from_value(d, TD_Opaque))
}
