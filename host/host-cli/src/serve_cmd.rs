//! `host serve`: flags (optionally from a TOML file; flags win), loading
//! the model with a progress line per stage, then the HTTP server.

use anyhow::{bail, Context, Result};
use clap::Args;
use host_engine::worker::Worker;
use host_engine::{DtypeChoice, Engine, Flow, GenerateRequest, SamplingParams};
use host_server::state::{ModelInfo, ServerConfig};
use host_server::SamplingDefaults;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// A TOML file with any of these options (keys as the flags, with `_`); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The plugins folder: one sub-folder per plugin with its plugin.toml (default ./plugins)
    #[arg(long)]
    pub plugins: Option<PathBuf>,
    /// The model folder (config.json, safetensors, tokenizer files); required
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The id `/v1/models` reports (default: the model folder's name).
    #[arg(long = "model-id")]
    pub model_id: Option<String>,
    /// auto (float32 on CPU, the checkpoint's on GPU), native, float32, bfloat16, float16.
    #[arg(long)]
    pub dtype: Option<String>,
    /// Multi-token attention on a GPU: fast (default; our short-query kernels) or mlx (MLX's sdpa, as mlx-lm).
    #[arg(long = "gpu-attention")]
    pub gpu_attention: Option<String>,
    /// Address to bind (default 127.0.0.1: local only).
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on (default 8080)
    #[arg(long)]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer <key>` on /v1/*.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Largest request body in bytes (default 4 MiB).
    #[arg(long = "body-limit")]
    pub body_limit: Option<usize>,
    /// Requests that may wait for the engine; beyond that, 503 + Retry-After (default 64).
    #[arg(long)]
    pub queue: Option<usize>,
    /// max_tokens for requests that give none (default 512).
    #[arg(long = "max-tokens")]
    pub max_tokens: Option<usize>,
    /// Rows that may share a decode step (continuous batching); 1 = strict serial (default 8).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Prefix cache capacity in GiB (reused prompt state; 0 disables; default 1).
    #[arg(long = "prompt-cache")]
    pub prompt_cache: Option<f64>,
    /// Memory budget in GiB for weights + KV + transients (default: 75% of RAM).
    #[arg(long = "memory-budget")]
    pub memory_budget: Option<f64>,
    /// Cap in GiB on the KV cache of all running requests together (default: none).
    #[arg(long = "kv-budget")]
    pub kv_budget: Option<f64>,
    /// MLX's buffer cache limit in GiB (freed buffers kept for reuse; counted in the memory budget; default: 32 MiB on the CPU, 1/16 of the budget on a GPU).
    #[arg(long = "mlx-cache-limit")]
    pub mlx_cache_limit: Option<f64>,
    /// Temperature for requests that give none (default: the model's generation_config.json, else 1)
    #[arg(long)]
    pub temp: Option<f32>,
    /// top_p for requests that give none
    #[arg(long = "top-p")]
    pub top_p: Option<f32>,
    /// top_k for requests that give none
    #[arg(long = "top-k")]
    pub top_k: Option<u32>,
    /// min_p for requests that give none
    #[arg(long = "min-p")]
    pub min_p: Option<f32>,
    /// repetition_penalty for requests that give none
    #[arg(long = "repetition-penalty")]
    pub repetition_penalty: Option<f32>,
    #[command(flatten)]
    pub draft: crate::draft_cmd::DraftArgs,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileArgs {
    plugins: Option<PathBuf>,
    model: Option<PathBuf>,
    model_id: Option<String>,
    dtype: Option<String>,
    gpu_attention: Option<String>,
    host: Option<String>,
    port: Option<u16>,
    api_key: Option<String>,
    body_limit: Option<usize>,
    queue: Option<usize>,
    max_tokens: Option<usize>,
    batch: Option<usize>,
    prompt_cache: Option<f64>,
    memory_budget: Option<f64>,
    kv_budget: Option<f64>,
    mlx_cache_limit: Option<f64>,
    temp: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    draft_model: Option<PathBuf>,
    draft_kind: Option<String>,
    num_draft_tokens: Option<usize>,
    ngram_max: Option<usize>,
    ngram_min: Option<usize>,
    speculate_always: Option<bool>,
    draft_ahead: Option<String>,
}

/// Flags over the file.
fn merge(a: ServeArgs) -> Result<ServeArgs> {
    let f: FileArgs = match &a.config {
        Some(p) => toml::from_str(&std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
            .with_context(|| format!("{}: invalid config", p.display()))?,
        None => FileArgs::default(),
    };
    Ok(ServeArgs {
        config: a.config,
        plugins: a.plugins.or(f.plugins),
        model: a.model.or(f.model),
        model_id: a.model_id.or(f.model_id),
        dtype: a.dtype.or(f.dtype),
        gpu_attention: a.gpu_attention.or(f.gpu_attention),
        host: a.host.or(f.host),
        port: a.port.or(f.port),
        api_key: a.api_key.or(f.api_key),
        body_limit: a.body_limit.or(f.body_limit),
        queue: a.queue.or(f.queue),
        max_tokens: a.max_tokens.or(f.max_tokens),
        batch: a.batch.or(f.batch),
        prompt_cache: a.prompt_cache.or(f.prompt_cache),
        memory_budget: a.memory_budget.or(f.memory_budget),
        kv_budget: a.kv_budget.or(f.kv_budget),
        mlx_cache_limit: a.mlx_cache_limit.or(f.mlx_cache_limit),
        temp: a.temp.or(f.temp),
        top_p: a.top_p.or(f.top_p),
        top_k: a.top_k.or(f.top_k),
        min_p: a.min_p.or(f.min_p),
        repetition_penalty: a.repetition_penalty.or(f.repetition_penalty),
        draft: crate::draft_cmd::DraftArgs {
            draft_model: a.draft.draft_model.or(f.draft_model),
            draft_kind: a.draft.draft_kind.or(f.draft_kind),
            num_draft_tokens: a.draft.num_draft_tokens.or(f.num_draft_tokens),
            ngram_max: a.draft.ngram_max.or(f.ngram_max),
            ngram_min: a.draft.ngram_min.or(f.ngram_min),
            speculate_always: a.draft.speculate_always || f.speculate_always.unwrap_or(false),
            draft_ahead: a.draft.draft_ahead.or(f.draft_ahead),
        },
    })
}

fn stage(n: usize, total: usize, what: &str, t0: Instant) {
    let done = "#".repeat(n * 20 / total);
    eprintln!("[{done:<20}] {n}/{total} {what} ({:.1}s)", t0.elapsed().as_secs_f64());
}

pub fn run(args: ServeArgs) -> Result<()> {
    let a = merge(args)?;
    let t0 = Instant::now();
    let Some(model_dir) = a.model.clone() else { bail!("--model DIR is required (or `model` in the --config file)") };
    let plugins = a.plugins.clone().unwrap_or_else(|| PathBuf::from("plugins"));
    crate::gpu_attention::apply(a.gpu_attention.as_deref())?;
    stage(0, 4, "discovering plugins", t0);
    let reg = crate::registry(&plugins)?;
    for r in &reg.refused {
        eprintln!("plugin refused: {} ({}): {}", r.name.as_deref().unwrap_or("?"), r.dir.display(), r.reason);
    }
    stage(1, 4, &format!("{} plugins loaded; composing {}", reg.plugins.len(), model_dir.display()), t0);
    let choice = DtypeChoice::parse(a.dtype.as_deref().unwrap_or("auto")).map_err(anyhow::Error::msg)?;
    let mut engine =
        Engine::load(&reg, &model_dir, choice).with_context(|| format!("loading {}", model_dir.display()))?;
    let cache_gib = a.prompt_cache.unwrap_or(1.0);
    if !(0.0..=1024.0).contains(&cache_gib) {
        bail!("--prompt-cache must be between 0 and 1024 GiB");
    }
    engine.set_prefix_cache((cache_gib * (1u64 << 30) as f64) as usize);
    crate::draft_cmd::install(&reg, &mut engine, &a.draft)?;
    stage(
        2,
        4,
        &format!(
            "{} via {} with {:?}; dtype {} ({})",
            engine.model.model_type,
            engine.model.family_plugin,
            dedup(&engine.model.layouts),
            engine.dtype_name,
            engine.dtype_reason
        ),
        t0,
    );
    // MLX maps weights lazily: one tiny generation reads them all now rather
    // than on the first request.
    let warm = GenerateRequest {
        prompt: vec![0],
        max_tokens: 1,
        params: SamplingParams::default(),
        stop_on_eos: false,
        logprobs: None,
        speculate: false,
    };
    engine.generate(&warm, |_| Flow::Continue).context("warm-up generation")?;
    stage(3, 4, "weights read (warm-up step done)", t0);
    let info =
        ModelInfo { max_context: engine.model.plan.max_context as usize, vocab_size: engine.model.plan.vocab_size };
    let memory = host_engine::admission::MemoryModel::measure(&engine);
    let gib = |g: f64| (g * (1u64 << 30) as f64) as u64;
    let memory_bytes = a.memory_budget.map(gib).unwrap_or_else(host_engine::admission::default_memory_budget);
    let mlx_cache_bytes =
        a.mlx_cache_limit.map(gib).unwrap_or_else(|| host_engine::admission::default_mlx_cache_limit(memory_bytes));
    host_engine::runtime::set_cache_limit(mlx_cache_bytes as usize);
    let budget = host_engine::admission::Budget { memory_bytes, kv_bytes: a.kv_budget.map(gib), mlx_cache_bytes };
    eprintln!(
        "memory: weights {:.3} GiB, KV {} bytes/token, budget {:.2} GiB (MLX buffer cache {:.3} GiB){}",
        host_engine::admission::gib(memory.weights_bytes),
        memory.kv_bytes_per_token,
        host_engine::admission::gib(budget.memory_bytes),
        host_engine::admission::gib(mlx_cache_bytes),
        budget.kv_bytes.map(|k| format!(", KV budget {:.4} GiB", host_engine::admission::gib(k))).unwrap_or_default()
    );
    if memory.weights_bytes + mlx_cache_bytes > memory_bytes {
        bail!(
            "the weights ({:.2} GiB) and MLX's buffer cache ({:.2} GiB) do not fit the memory budget of {:.2} GiB",
            host_engine::admission::gib(memory.weights_bytes),
            host_engine::admission::gib(mlx_cache_bytes),
            host_engine::admission::gib(memory_bytes)
        );
    }
    let text = engine.text.clone();
    let caps = engine.capabilities();
    let draft_kind = engine.drafter.as_ref().and_then(|d| d.lock().ok().map(|g| g.1.clone()));
    let model_id = a.model_id.clone().unwrap_or_else(|| {
        model_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
    });
    let cfg = ServerConfig {
        host: a.host.clone().unwrap_or_else(|| "127.0.0.1".into()),
        port: a.port.unwrap_or(8080),
        api_key: a.api_key.clone(),
        body_limit: a.body_limit.unwrap_or(4 << 20),
        queue: a.queue.unwrap_or(64),
        default_max_tokens: a.max_tokens.unwrap_or(512),
        batch: a.batch.unwrap_or(8).max(1),
        defaults: SamplingDefaults {
            temperature: a.temp,
            top_p: a.top_p,
            top_k: a.top_k,
            min_p: a.min_p,
            repetition_penalty: a.repetition_penalty,
        },
        model_id,
    };
    let worker = Worker::start(engine, cfg.queue, cfg.batch, Some((memory, budget)));
    stage(4, 4, &format!("ready: serving `{}` on http://{}:{}", cfg.model_id, cfg.host, cfg.port), t0);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(host_server::serve(cfg, worker, text, info, caps, memory, budget, draft_kind))?;
    Ok(())
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
