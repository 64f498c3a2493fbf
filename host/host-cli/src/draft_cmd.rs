//! Speculative decoding flags shared by `generate` and `serve`, and
//! installing the drafter they name into the engine.

use anyhow::{bail, Context, Result};
use clap::Args;
use host_engine::Engine;
use host_loader::Registry;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug, Default, Clone)]
pub struct DraftArgs {
    /// A draft model folder (two-model, or a kind detected from its files).
    #[arg(long = "draft-model")]
    pub draft_model: Option<PathBuf>,
    /// The draft kind (ngram, two-model, ...); detected from --draft-model when omitted.
    #[arg(long = "draft-kind")]
    pub draft_kind: Option<String>,
    /// Most tokens drafted per round (default: 10 for ngram, 3 otherwise).
    #[arg(long = "num-draft-tokens")]
    pub num_draft_tokens: Option<usize>,
    /// ngram: the longest trailing n-gram looked up (default 3).
    #[arg(long = "ngram-max")]
    pub ngram_max: Option<usize>,
    /// ngram: the shortest trailing n-gram looked up (default 1).
    #[arg(long = "ngram-min")]
    pub ngram_min: Option<usize>,
    /// Keep speculating even when rounds do not pay (low acceptance, or
    /// rounds slower than plain steps): for measurements and experiments.
    #[arg(long = "speculate-always")]
    pub speculate_always: bool,
    /// Pipelined rounds for greedy serial requests: queue round i+1 before
    /// reading round i's verdict. auto: when the drafter advertises
    /// `draft-ahead` (the default); on: whenever it implements it
    /// (experiments); off.
    #[arg(long = "draft-ahead", value_name = "auto|on|off")]
    pub draft_ahead: Option<String>,
}

/// Opens and installs the drafter the flags describe (nothing if none).
pub fn install(reg: &Arc<Registry>, engine: &mut Engine, a: &DraftArgs) -> Result<()> {
    let kind = match (&a.draft_kind, &a.draft_model) {
        (None, None) => return Ok(()),
        (Some(k), _) => k.clone(),
        (None, Some(dir)) => host_loader::draft_kind::detect(dir),
    };
    let ahead =
        host_engine::DraftAhead::parse(a.draft_ahead.as_deref().unwrap_or("auto")).map_err(anyhow::Error::msg)?;
    if kind == "ngram" && a.draft_model.is_some() {
        bail!("the ngram drafter is never combined with a draft model (drop --draft-model or choose another --draft-kind)");
    }
    if let Some(dir) = &a.draft_model {
        same_tokenizer(engine, dir)?;
    }
    let depth = a.num_draft_tokens.unwrap_or(if kind == "ngram" { 10 } else { 3 });
    if !(1..=32).contains(&depth) {
        bail!("--num-draft-tokens must be between 1 and 32");
    }
    let mut options = Vec::new();
    if let Some(n) = a.ngram_max {
        options.push(("ngram-max".to_owned(), n.to_string()));
    }
    if let Some(n) = a.ngram_min {
        options.push(("ngram-min".to_owned(), n.to_string()));
    }
    let (factory, drafter) = host_loader::services::open_drafter(
        reg,
        &kind,
        a.draft_model.as_deref(),
        depth as u32,
        &options,
        engine.compute_dtype,
    )
    .map_err(anyhow::Error::msg)?;
    let plugin = factory.plugin.clone();
    let caps: Vec<String> = reg
        .by_name(&plugin)
        .map(|p| p.manifest.capabilities.iter().map(|c| c.to_string()).collect())
        .unwrap_or_default();
    eprintln!("speculative decoding: kind {kind} via {plugin}, up to {depth} tokens per round");
    engine.set_drafter(drafter, &kind, &plugin, caps, depth);
    engine.draft_kv_bytes_per_token = factory.cache_bytes_per_token();
    if !engine.history_only_drafter() {
        // Per-request state: batched rows each open their own instance
        // (the draft model's weights are shared, its caches are not).
        engine.drafter_factory = Some(Box::new(move || factory.open()));
    }
    engine.speculate_always = a.speculate_always;
    engine.draft_ahead = ahead;
    Ok(())
}

/// The start-up probe: a draft model must tokenize exactly as the target.
fn same_tokenizer(engine: &Engine, dir: &std::path::Path) -> Result<()> {
    let target = engine.text.as_ref().context("the target has no tokenizer.json to compare a draft model with")?;
    let path = dir.join("tokenizer.json");
    let draft = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| anyhow::anyhow!("draft model {}: {e} (its tokenizer must match the target's)", path.display()))?;
    if draft.get_vocab(true) != target.tokenizer.get_vocab(true) {
        bail!("the draft model's tokenizer ({}) differs from the target's: speculative decoding needs the same vocabulary", path.display());
    }
    let probe = "The quick brown fox 123 jumps! <|im_start|>";
    let ids = |t: &tokenizers::Tokenizer| t.encode(probe, false).map(|e| e.get_ids().to_vec()).unwrap_or_default();
    if ids(&draft) != ids(&target.tokenizer) {
        bail!("the draft model's tokenizer encodes differently from the target's");
    }
    Ok(())
}
