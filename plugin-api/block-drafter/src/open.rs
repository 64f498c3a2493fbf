//! Opening a block drafter against the target: its config (and the
//! optional `dspark.json` beside it) read, checked against the target's
//! plan and folder (one line naming the mismatch), its caches made by the
//! host.

use crate::config::{Args, Layout};
use crate::net::Net;
use crate::rounds::{BlockDrafter, Shape};
use model_kit::config::Config;
use model_kit::layers::LoadCtx;
use model_kit::weights::Weights;
use plugin_api::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn bad(msg: String) -> PluginError {
    PluginError::invalid_config(msg)
}

/// `dspark.json` (the ancestor's file for locally trained DSpark heads):
/// `variant` `dspark`, `gamma` proposals per round, `sts` per-position
/// confidence thresholds, `minConf` for positions past them; `seqHead`
/// `rnn` is not built.
struct Side {
    gamma: Option<usize>,
    thresholds: Vec<f32>,
}

fn side_file(dir: &Path) -> Result<Option<Side>, PluginError> {
    let Ok(text) = std::fs::read_to_string(dir.join("dspark.json")) else { return Ok(None) };
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("dspark.json: {e}")))?;
    match v["variant"].as_str() {
        Some("dspark" | "dflash") | None => {}
        Some(other) => return Err(bad(format!("dspark.json variant `{other}` is not built"))),
    }
    if let Some(head) = v["seqHead"].as_str().filter(|h| *h != "vanilla") {
        return Err(bad(format!("dspark.json seqHead `{head}` is not built (only the vanilla Markov head)")));
    }
    let mut thresholds: Vec<f32> = match &v["sts"] {
        Value::Array(a) => a.iter().filter_map(Value::as_f64).map(|x| x as f32).collect(),
        _ => Vec::new(),
    };
    if let Some(m) = v["minConf"].as_f64() {
        thresholds.push(m as f32);
    }
    let gamma = v["gamma"].as_u64().map(|g| g as usize).filter(|g| *g > 0);
    Ok(Some(Side { gamma, thresholds }))
}

/// The option `confidence-thresholds=0.6,0.5,...` (overrides dspark.json).
fn option_thresholds(args: &DrafterOpenArgs) -> Result<Option<Vec<f32>>, PluginError> {
    let Some(o) = args.options.iter().find(|o| o.0.as_str() == "confidence-thresholds") else { return Ok(None) };
    o.1.as_str()
        .split(',')
        .map(|x| x.trim().parse::<f32>().map_err(|_| bad(format!("confidence threshold `{x}` is not a number"))))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn target_layers(host: &HostServicesBox) -> Option<usize> {
    let dir = host.target_dir().into_result().ok()?;
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(dir.as_str()).join("config.json")).ok()?).ok()?;
    let n = |v: &Value| v.get("num_hidden_layers").and_then(Value::as_u64);
    n(&v).or_else(|| v.get("text_config").and_then(n)).map(|n| n as usize)
}

/// A drafter of `layout` from `args.dir`, fitted to the target.
pub fn open(args: &DrafterOpenArgs, host: HostServicesBox, layout: Layout) -> Result<BlockDrafter, PluginError> {
    let dir: PathBuf = match args.dir.as_ref().into_option() {
        Some(d) => d.as_str().into(),
        None => return Err(bad("a block drafter needs its folder (--draft-model)".into())),
    };
    let text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| PluginError::io(format!("{}: {e}", dir.join("config.json").display())))?;
    // A DFlash network may come in speculators' layout (`speculators.rs`).
    let mut a = if layout == Layout::DFlash && crate::speculators::declared(&text) {
        crate::speculators::args(&text)
    } else {
        Args::from_config(&text, layout)
    }
    .map_err(|e| bad(e.what().to_owned()))?;
    let side = side_file(&dir)?;
    if let Some(g) = side.as_ref().and_then(|s| s.gamma) {
        a.width = a.width.min(g + 1);
    }
    let plan = host.target_plan().into_result()?;
    if a.hidden != plan.hidden_size as usize {
        return Err(bad(format!(
            "the drafter's hidden size {} differs from the target's {}",
            a.hidden, plan.hidden_size
        )));
    }
    if a.vocab_size != plan.vocab_size as usize {
        return Err(bad(format!(
            "the drafter's vocabulary ({}) differs from the target's ({})",
            a.vocab_size, plan.vocab_size
        )));
    }
    if let (Some(want), Some(have)) = (a.num_target_layers, target_layers(&host)) {
        if want != have {
            return Err(bad(format!("the drafter was made for {want} target layers, the target has {have}")));
        }
    }
    let thresholds = match option_thresholds(args)? {
        Some(t) => t,
        None => side.map(|s| s.thresholds).unwrap_or_default(),
    };
    if !thresholds.is_empty() && a.confidence.is_none() {
        return Err(bad("confidence thresholds are set but the drafter has no confidence head".into()));
    }
    // The compute dtype is the target's.
    let dtype = model_kit::ops::dtype_from_raw(host.target_dtype().into_result()?.0).map_err(plugin_sdk::mlx_error)?;
    let net = crate::net::shared(&dir, dtype, || {
        let cfg = Config::parse(&text).map_err(|e| bad(e.what().to_owned()))?;
        let quant = cfg.quantization().map_err(|e| bad(e.what().to_owned()))?;
        let mut weights = Weights::load(&dir).map_err(|e| PluginError::io(e.what().to_owned()))?;
        weights.strip_prefix("model.");
        if crate::speculators::declared(&text) {
            let reduced = a.draft_vocab.is_some();
            weights.drop_matching(|name| crate::speculators::verifier_owned(name, reduced));
        }
        let mut ctx = LoadCtx::new(&mut weights, quant.as_ref(), Some(dtype));
        let net = Net::load(&mut ctx, &a).map_err(|e| bad(e.what().to_owned()))?;
        ctx.materialize().map_err(|e| PluginError::io(e.what().to_owned()))?;
        let left = weights.remaining();
        if !left.is_empty() {
            return Err(bad(format!("{} unexpected tensors in the drafter (first: {})", left.len(), left[0])));
        }
        Ok(net)
    })?;
    let layers = net.lock().block.layers();
    let need = LayerNeed::full(a.kv_heads as u32, a.head_dim as u32);
    let caches = (0..layers).map(|_| host.new_cache(&need).into_result()).collect::<Result<Vec<_>, _>>()?;
    let trace = args.options.iter().find(|o| o.0.as_str() == "trace").map(|o| PathBuf::from(o.1.as_str()));
    let shape = Shape {
        proposals: a.proposals().min(args.max_depth.max(1) as usize),
        mask_token_id: a.mask_token_id,
        sample_from_anchor: a.sample_from_anchor,
        softcap: a.final_logit_softcapping,
        taps: a.target_layer_ids.clone(),
        thresholds,
        width: a.width,
        window: a.window,
    };
    Ok(BlockDrafter::new(net, shape, caches, host, trace))
}
