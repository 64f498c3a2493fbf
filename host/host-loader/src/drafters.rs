//! Drafter plugins as the host sees them: which kind a draft folder is
//! (each plugin's own `detect_draft` decides; the host names no kind), and
//! what a kind's plugin advertises.

use crate::registry::{LoadedPlugin, Registry};
use abi_stable::std_types::RStr;
use plugin_api::PluginKind;
use std::path::Path;

impl Registry {
    /// The draft kind of the folder `dir`: the first kind claimed by the
    /// drafter plugin whose `detect_draft` is most confident (ties: plugin
    /// name order). None when no plugin recognises it. Plugins score by the
    /// levels in `plugin_api::detect` (a dedicated file over an
    /// architecture name over a model type over "any model folder"), which
    /// reproduces the ancestor's order without the host naming a kind.
    pub fn detect_draft_kind(&self, dir: &Path) -> Option<String> {
        let config = std::fs::read_to_string(dir.join("config.json")).unwrap_or_default();
        let dir = dir.to_string_lossy();
        self.of_kind(PluginKind::DRAFTER)
            .filter_map(|p| {
                let detect = p.root.detect_draft()?;
                let score = detect(RStr::from_str(&dir), RStr::from_str(&config));
                let kind = p.manifest.claims.draft_kinds.first()?;
                (score > 0).then(|| (score, kind.to_string()))
            })
            .fold(None, |best: Option<(u32, String)>, (score, kind)| match best {
                Some((s, _)) if s >= score => best,
                _ => Some((score, kind)),
            })
            .map(|(_, kind)| kind)
    }

    /// The drafter plugins that implement draft kind `kind`.
    pub fn drafters_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a LoadedPlugin> + 'a {
        self.of_kind(PluginKind::DRAFTER)
            .filter(move |p| p.manifest.claims.draft_kinds.iter().any(|k| k.as_str() == kind))
    }

    /// Capability tags of the plugin implementing draft kind `kind`.
    pub fn drafter_capabilities(&self, kind: &str) -> Vec<String> {
        self.drafters_of(kind)
            .next()
            .map(|p| p.manifest.capabilities.iter().map(|c| c.to_string()).collect())
            .unwrap_or_default()
    }

    /// Every draft kind the loaded drafter plugins implement.
    pub fn draft_kinds(&self) -> Vec<String> {
        self.of_kind(PluginKind::DRAFTER)
            .flat_map(|p| p.manifest.claims.draft_kinds.iter().map(|k| k.to_string()))
            .collect()
    }
}
