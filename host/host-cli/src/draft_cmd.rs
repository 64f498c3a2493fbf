//! Speculative decoding flags shared by `generate` and `serve`, turned into
//! the engine's speculation configuration.

use anyhow::{bail, Result};
use clap::Args;
use host_engine::{DraftSource, SpeculationConfig};
use std::path::PathBuf;

#[derive(Args, Debug, Default, Clone, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DraftArgs {
    /// A draft model folder (two-model, or a kind the drafter plugins detect from its files).
    #[arg(long = "draft-model")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<PathBuf>,
    /// The draft kind (ngram, two-model, ...); detected from --draft-model when omitted.
    #[arg(long = "draft-kind")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_kind: Option<String>,
    /// Most tokens drafted per round (default: the drafter's own, e.g. 10 for ngram, 3 for two-model).
    #[arg(long = "num-draft-tokens")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_draft_tokens: Option<usize>,
    /// A drafter option, `key=value`, passed to the drafter plugin as it is (repeatable; e.g. ngram-max=3).
    #[arg(long = "draft-option", value_name = "KEY=VALUE")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub draft_option: Vec<String>,
    /// Same as --draft-option ngram-max=N.
    #[arg(long = "ngram-max", hide = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngram_max: Option<usize>,
    /// Same as --draft-option ngram-min=N.
    #[arg(long = "ngram-min", hide = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngram_min: Option<usize>,
    /// Keep speculating even when rounds do not pay (low acceptance, or
    /// rounds slower than plain steps): for measurements and experiments.
    #[arg(long = "speculate-always")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub speculate_always: bool,
}

/// `key=value` pairs, with the option named in errors.
pub fn key_values(flag: &str, given: &[String]) -> Result<Vec<(String, String)>> {
    given
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => bail!("{flag} takes key=value, got `{kv}`"),
        })
        .collect()
}

impl DraftArgs {
    /// The engine's speculation configuration (None: no drafter).
    pub fn config(&self) -> Result<Option<SpeculationConfig>> {
        if self.draft_kind.is_none() && self.draft_model.is_none() {
            return Ok(None);
        }
        let mut options = key_values("--draft-option", &self.draft_option)?;
        let alias = [("ngram-max", self.ngram_max), ("ngram-min", self.ngram_min)];
        options.extend(alias.iter().filter_map(|(k, v)| v.map(|v| ((*k).to_owned(), v.to_string()))));
        Ok(Some(SpeculationConfig {
            source: DraftSource::Plugin {
                kind: self.draft_kind.clone(),
                draft_model: self.draft_model.clone(),
                options,
            },
            depth: self.num_draft_tokens,
            always: self.speculate_always,
        }))
    }
}
