//! Loading the served model: the plugins discovered, the model composed,
//! its weights read by a warm-up step and MLX's buffer cache limit set, with
//! a progress line per stage.

use crate::serve_args::{bytes_of_gib, ServeArgs};
use anyhow::{bail, Context, Result};
use host_engine::{DtypeChoice, Engine, EngineConfig, Flow, GenerateRequest, SamplingParams};
use host_server::state::ModelInfo;
use std::path::PathBuf;
use std::time::Instant;

/// What the HTTP layer needs from the loaded engine.
pub struct Served {
    pub text: Option<std::sync::Arc<host_engine::tokenizer::TextSide>>,
    pub info: ModelInfo,
    pub planner: host_engine::plan::Planner,
    pub memory: host_engine::admission::MemoryModel,
    pub budget: host_engine::admission::Budget,
}

/// The engine, loaded and warmed up, with its memory model and budget.
pub struct Loaded {
    pub engine: Engine,
    pub info: ModelInfo,
    pub memory: host_engine::admission::MemoryModel,
    pub budget: host_engine::admission::Budget,
}

/// Discovers the plugins, loads the model, reads its weights once and
/// sets MLX's buffer cache limit (stages 0 to 3 of the progress lines).
/// `ranks`: the tensor-parallel ranks this process is one of (1: alone).
pub fn load(a: &ServeArgs, model_dir: &std::path::Path, t0: Instant, ranks: usize) -> Result<Loaded> {
    let plugins = a.plugins.clone().unwrap_or_else(|| PathBuf::from("plugins"));
    stage(0, 4, "discovering plugins", t0);
    let reg = crate::plugin_registry::registry(&plugins)?;
    for r in &reg.refused {
        eprintln!("plugin refused: {} ({}): {}", r.name.as_deref().unwrap_or("?"), r.dir.display(), r.reason);
    }
    stage(1, 4, &format!("{} plugins loaded; composing {}", reg.plugins.len(), model_dir.display()), t0);
    let cache_gib = a.prompt_cache.unwrap_or(1.0);
    if !(0.0..=1024.0).contains(&cache_gib) {
        bail!("--prompt-cache must be between 0 and 1024 GiB");
    }
    let ssd_max = a.ssd_cache_max.unwrap_or(16.0);
    if !(0.0..=1_000_000.0).contains(&ssd_max) {
        bail!("--ssd-cache-max must be between 0 and 1000000 GiB");
    }
    if a.ssd_cache.is_some() && cache_gib == 0.0 {
        bail!("--ssd-cache needs the prefix cache (--prompt-cache above 0): entries are promoted into it");
    }
    let ssd_cache = a.ssd_cache.clone().map(|dir| host_engine::ssd_cache::SsdConfig {
        dir,
        max_bytes: bytes_of_gib(ssd_max),
        verify: a.ssd_cache_verify,
    });
    let cfg = EngineConfig {
        dtype: DtypeChoice::parse(a.dtype.as_deref().unwrap_or("auto"))?,
        prefix_cache_bytes: bytes_of_gib(cache_gib) as usize,
        ssd_cache,
        model_options: crate::model_options::options(a.gpu_attention.as_deref(), &a.model_option)?
            .into_iter()
            .chain(crate::tp_launch::model_option(ranks))
            .collect(),
        speculation: a.draft.config()?,
        kv_scheme: a.kv.scheme()?,
        generation_checkpoint: a.generation_checkpoint,
        ..Default::default()
    };
    let engine = Engine::load(&reg, model_dir, cfg).with_context(|| format!("loading {}", model_dir.display()))?;
    if let Some(d) = engine.drafting() {
        eprintln!("speculative decoding: kind {} via {}, up to {} tokens per round", d.kind, d.plugin, d.depth);
    }
    let m = engine.model();
    let what = format!(
        "{} via {} with {:?}; dtype {} ({}); KV {}",
        m.model_type,
        m.family_plugin,
        dedup(&m.layouts),
        engine.dtype_name(),
        engine.dtype_reason(),
        m.scheme_summary()
    );
    stage(2, 4, &what, t0);
    // MLX maps weights lazily: one tiny generation reads them all now rather
    // than on the first request.
    let warm = GenerateRequest {
        prompt: vec![0],
        max_tokens: 1,
        params: SamplingParams::default(),
        stop_on_eos: false,
        logprobs: None,
        constraint: None,
    };
    let mut plain = engine.plan(&warm, 1);
    plain.method = host_engine::plan::Method::Autoregressive;
    plain.prompt_cache = false;
    host_engine::serial::generate(&engine, &warm, &plain, |_| Flow::Continue).context("warm-up generation")?;
    stage(3, 4, "weights read (warm-up step done)", t0);
    let info = ModelInfo {
        max_context: m.plan.max_context as usize,
        vocab_size: m.plan.vocab_size,
        hidden_size: m.plan.hidden_size as usize,
        embeddings: engine.pooling().clone(),
    };
    if let Ok(p) = &info.embeddings {
        eprintln!("embeddings: {} pooling{}", p.mode.name(), if p.normalize { ", normalized" } else { "" });
    }
    let memory = host_engine::admission::MemoryModel::measure(&engine);
    let memory_bytes = a.memory_budget.map(bytes_of_gib).unwrap_or_else(host_engine::admission::default_memory_budget);
    let mlx_cache_bytes = a
        .mlx_cache_limit
        .map(bytes_of_gib)
        .unwrap_or_else(|| host_engine::admission::default_mlx_cache_limit(memory_bytes));
    host_engine::runtime::set_cache_limit(mlx_cache_bytes as usize);
    let budget =
        host_engine::admission::Budget { memory_bytes, kv_bytes: a.kv_budget.map(bytes_of_gib), mlx_cache_bytes };
    let g = host_engine::admission::gib;
    eprintln!(
        "memory: weights {:.3} GiB, KV {} bytes/token, budget {:.2} GiB (MLX buffer cache {:.3} GiB){}",
        g(memory.weights_bytes),
        memory.kv_bytes_per_token,
        g(budget.memory_bytes),
        g(mlx_cache_bytes),
        budget.kv_bytes.map(|k| format!(", KV budget {:.4} GiB", g(k))).unwrap_or_default()
    );
    if memory.weights_bytes + mlx_cache_bytes > memory_bytes {
        bail!(
            "the weights ({:.2} GiB) and MLX's buffer cache ({:.2} GiB) do not fit the memory budget of {:.2} GiB",
            g(memory.weights_bytes),
            g(mlx_cache_bytes),
            g(memory_bytes)
        );
    }
    Ok(Loaded { engine, info, memory, budget })
}

pub(crate) fn stage(n: usize, total: usize, what: &str, t0: Instant) {
    let done = "#".repeat(n * 20 / total);
    eprintln!("[{done:<20}] {n}/{total} {what} ({:.1}s)", t0.elapsed().as_secs_f64());
}

fn dedup(v: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in v {
        if !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}
