//! Opening a head against the target: its folder located, its config and
//! tensors checked against the target's plan (one line naming the
//! mismatch), its caches made by the host.

use crate::head::{Args, Head};
use crate::rounds::Mtp;
use crate::source::{locate, tensor_names};
use model_kit::config::Config;
use model_kit::layers::LoadCtx;
use model_kit::weights::Weights;
use plugin_api::*;
use std::path::PathBuf;

fn bad(msg: String) -> PluginError {
    PluginError::invalid_config(msg)
}

pub fn open(args: &DrafterOpenArgs, host: HostServicesBox) -> Result<Mtp, PluginError> {
    let dir: PathBuf = match args.dir.as_ref().into_option() {
        Some(d) => d.as_str().into(),
        None => host.target_dir().into_result()?.as_str().into(),
    };
    let src = locate(&dir).ok_or_else(|| {
        bad(format!(
            "mtp: {} holds no MTP head (no `*_mtp` config.json, no mtp/ folder, no mtp.* tensors)",
            dir.display()
        ))
    })?;
    let config = match src.speculators {
        true => crate::speculators::config(&src.config),
        false => Ok(src.config.clone()),
    };
    let config = config.map_err(|e| bad(format!("mtp: {}", e.what())))?;
    let a = Args::from_config(&config).map_err(|e| bad(format!("mtp: {}", e.what())))?;
    let plan = host.target_plan().into_result()?;
    if a.hidden != plan.hidden_size as usize {
        return Err(bad(format!(
            "mtp: the head's hidden size {} differs from the target's {}",
            a.hidden, plan.hidden_size
        )));
    }
    if a.vocab_size != 0 && a.vocab_size != plan.vocab_size as usize {
        return Err(bad(format!(
            "mtp: the head's vocabulary ({}) differs from the target's ({})",
            a.vocab_size, plan.vocab_size
        )));
    }
    // The compute dtype is the target's.
    let dtype = model_kit::ops::dtype_from_raw(host.target_dtype().into_result()?.0).map_err(plugin_sdk::mlx_error)?;
    // One head per folder and dtype, shared by every instance (batch rows).
    let key = format!("{}|{}|{dtype:?}", src.dir.display(), src.inside_target);
    let head = plugin_sdk::shared::shared(&key, || {
        let cfg = Config::parse(&config).map_err(|e| bad(format!("mtp: {}", e.what())))?;
        let quant = cfg.quantization().map_err(|e| bad(format!("mtp: {}", e.what())))?;
        let mut weights = Weights::load(&src.dir).map_err(|e| PluginError::io(format!("mtp: {}", e.what())))?;
        let prefixed = src.inside_target || tensor_names(&src.dir).iter().any(|n| n.starts_with("mtp."));
        if src.inside_target {
            weights.drop_matching(|k| !k.starts_with("mtp."));
        }
        // Tensor names by layout; speculators' and the `mtp.*` tensors
        // keep Hugging Face's norms (stored minus one).
        let name = |n: &str| match (src.speculators, prefixed) {
            (true, _) => crate::speculators::tensor(n),
            (false, true) => format!("mtp.{n}"),
            (false, false) => n.to_owned(),
        };
        let mut ctx = LoadCtx::new(&mut weights, quant.as_ref(), Some(dtype));
        let shift = prefixed || src.speculators;
        let head = Head::load(&mut ctx, &a, &name, shift).map_err(|e| bad(format!("mtp: {}", e.what())))?;
        ctx.materialize().map_err(|e| PluginError::io(format!("mtp: {}", e.what())))?;
        let left = weights.remaining();
        if !left.is_empty() {
            return Err(bad(format!("mtp: {} unexpected tensors in the head (first: {})", left.len(), left[0])));
        }
        Ok(head)
    })?;
    let layers = head.lock().layers();
    let need = LayerNeed::full(a.kv_heads as u32, a.head_dim as u32);
    let caches = (0..layers).map(|_| host.new_cache(&need).into_result()).collect::<Result<Vec<_>, _>>()?;
    let trace = args.options.iter().find(|o| o.0.as_str() == "trace").map(|o| PathBuf::from(o.1.as_str()));
    Ok(Mtp::new(head, caches, host, args.max_depth.max(1) as usize, trace))
}
