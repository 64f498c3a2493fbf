//! Opening an assistant against its target: its config and tensors
//! checked against the target's plan (one line naming the mismatch), its
//! weights loaded once per folder and dtype and shared by every instance.

use crate::config::Args;
use crate::net::Net;
use crate::rounds::{Assistant, Setup};
use model_kit::config::Config;
use model_kit::layers::LoadCtx;
use model_kit::weights::Weights;
use plugin_api::*;
use std::path::PathBuf;

fn bad(msg: String) -> PluginError {
    PluginError::invalid_config(format!("assistant: {msg}"))
}

/// Per-layer-input tensors a Gemma 4 text config may give the layers; the
/// reference builds them and never feeds them (no per-layer input).
const UNUSED: &[&str] = &[".per_layer_input_gate.", ".per_layer_projection.", ".post_per_layer_input_norm."];

pub fn open(args: &DrafterOpenArgs, host: HostServicesBox) -> Result<Assistant, PluginError> {
    let dir: PathBuf = match args.dir.as_ref().into_option() {
        Some(d) => d.as_str().into(),
        None => return Err(bad("needs its folder (--draft-model)".into())),
    };
    let config = match args.config_json.as_ref().into_option() {
        Some(c) => c.to_string(),
        None => std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| PluginError::io(format!("assistant: {}: {e}", dir.join("config.json").display())))?,
    };
    let a = Args::from_config(&config).map_err(|e| bad(e.what().to_owned()))?;
    let plan = host.target_plan().into_result()?;
    if a.backbone_hidden != plan.hidden_size as usize {
        return Err(bad(format!(
            "backbone_hidden_size {} differs from the target's hidden size {}",
            a.backbone_hidden, plan.hidden_size
        )));
    }
    if a.vocab_size != plan.vocab_size as usize {
        return Err(bad(format!(
            "the head's vocabulary ({}) differs from the target's ({})",
            a.vocab_size, plan.vocab_size
        )));
    }
    fits(&a, &plan)?;
    let dtype = model_kit::ops::dtype_from_raw(host.target_dtype().into_result()?.0).map_err(plugin_sdk::mlx_error)?;
    let key = format!("{}|{dtype:?}", dir.display());
    let net = plugin_sdk::shared::shared(&key, || {
        let cfg = Config::parse(&config).map_err(|e| bad(e.what().to_owned()))?;
        let quant = cfg.quantization().map_err(|e| bad(e.what().to_owned()))?;
        let mut weights = Weights::load(&dir).map_err(|e| PluginError::io(format!("assistant: {}", e.what())))?;
        weights.drop_matching(|k| UNUSED.iter().any(|u| k.contains(u)) || (a.tied && k == "lm_head.weight"));
        let mut ctx = LoadCtx::new(&mut weights, quant.as_ref(), Some(dtype));
        let net = Net::load(&mut ctx, &a).map_err(|e| bad(e.what().to_owned()))?;
        ctx.materialize().map_err(|e| PluginError::io(format!("assistant: {}", e.what())))?;
        let left = weights.remaining();
        if !left.is_empty() {
            return Err(bad(format!("{} unexpected tensors (first: {})", left.len(), left[0])));
        }
        Ok(net)
    })?;
    let trace = args.options.iter().find(|o| o.0.as_str() == "trace").map(|o| PathBuf::from(o.1.as_str()));
    Ok(Assistant::new(Setup {
        net,
        host,
        // The target's own embedding scale (a Gemma target scales by √H).
        embed_scale: (plan.hidden_size as f64).sqrt() as f32,
        window: a.sliding_window,
        depth: args.max_depth.max(1) as usize,
        trace,
    }))
}

/// Each kind of the head's layers attends the target's last cached layer
/// of that kind: the target must have one, with the head's head size, and
/// the query heads must group over its K/V heads.
fn fits(a: &Args, plan: &ModelPlan) -> Result<(), PluginError> {
    for sliding in [true, false] {
        let Some(l) = a.layers.iter().find(|l| l.sliding == sliding) else { continue };
        let (kind, name) = match sliding {
            true => (NeedKind::SLIDING, "sliding-window"),
            false => (NeedKind::FULL, "full-attention"),
        };
        let Some(need) = plan.layers.iter().rev().find(|n| n.kind == kind) else {
            return Err(bad(format!("the head has {name} layers and the target no {name} layer to attend")));
        };
        if need.k_head_dim as usize != l.head_dim || need.v_head_dim as usize != l.head_dim {
            return Err(bad(format!(
                "the head's {name} layers have head size {}, the target's last {name} layer {}",
                l.head_dim, need.k_head_dim
            )));
        }
        if need.kv_heads == 0 || !a.heads.is_multiple_of(need.kv_heads as usize) {
            return Err(bad(format!(
                "the head's {} query heads do not group over the target's {} K/V heads ({name})",
                a.heads, need.kv_heads
            )));
        }
    }
    Ok(())
}
