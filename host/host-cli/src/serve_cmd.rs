//! `host serve`: flags (optionally from a TOML file; flags win), loading
//! the model with a progress line per stage, then the HTTP server.
//!
//! Every option is declared once, below: clap reads the flags, serde reads
//! the same struct from the file (keys as the flags, with `_`), and the
//! file's keys are checked against the flags clap knows.

use anyhow::{bail, Context, Result};
use clap::Args;
use host_engine::worker::Worker;
use host_engine::{DtypeChoice, Engine, EngineConfig, Flow, GenerateRequest, SamplingParams};
use host_server::reasoning::ThinkingDefault;
use host_server::state::{ModelInfo, ServerConfig};
use host_server::system_rules::SystemRules;
use host_server::SamplingDefaults;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct ServeArgs {
    /// A TOML file with any of these options (keys as the flags, with `_`); flags override it.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The plugins folder: one sub-folder per plugin with its plugin.toml (default ./plugins)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugins: Option<PathBuf>,
    /// The model folder (config.json, safetensors, tokenizer files); required
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// The id `/v1/models` reports (default: the model folder's name).
    #[arg(long = "model-id")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// auto (float32 on CPU, the checkpoint's on GPU), native, float32, bfloat16, float16.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Multi-token attention on a GPU: fast (default; our short-query kernels) or mlx (MLX's sdpa, as mlx-lm).
    #[arg(long = "gpu-attention")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_attention: Option<String>,
    /// An option for the model family plugin, `key=value` (repeatable; docs/plugin-guide.md lists model-kit's).
    #[arg(long = "model-option", value_name = "KEY=VALUE")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub model_option: Vec<String>,
    /// Address to bind (default 127.0.0.1: local only).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Port to listen on (default 8080)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer <key>` or `x-api-key: <key>` on /v1/*.
    #[arg(long = "api-key")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Largest request body in bytes (default 4 MiB).
    #[arg(long = "body-limit")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_limit: Option<usize>,
    /// Requests that may wait for the engine; beyond that, 503 + Retry-After (default 64).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<usize>,
    /// max_tokens for requests that give none (default 512).
    #[arg(long = "max-tokens")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    /// Rows that may share a decode step (continuous batching); 1 = strict serial (default 32).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    /// Prefix cache capacity in GiB (reused prompt state; 0 disables; default 1).
    #[arg(long = "prompt-cache")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<f64>,
    /// A directory for the prefix cache's SSD tier: every stored prompt state is also written
    /// there (one file per entry) and read back on a later lookup, across restarts (default: none).
    #[arg(long = "ssd-cache", value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssd_cache: Option<PathBuf>,
    /// Cap in GiB on this model's files in the --ssd-cache directory; least recently used go first (default 16).
    #[arg(long = "ssd-cache-max", value_name = "GiB")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssd_cache_max: Option<f64>,
    /// Check every --ssd-cache file's content hash when it is read (the header and sizes always are).
    #[arg(long = "ssd-cache-verify")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ssd_cache_verify: bool,
    /// Memory budget in GiB for weights + KV + transients + MLX's buffer cache + the prefix cache (default: 75% of the device's memory).
    #[arg(long = "memory-budget")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_budget: Option<f64>,
    /// Cap in GiB on the KV cache of all running requests together (default: none).
    #[arg(long = "kv-budget")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_budget: Option<f64>,
    /// MLX's buffer cache limit in GiB (freed buffers kept for reuse; counted in the memory budget; default: 32 MiB on the CPU, 1/16 of the budget on a GPU).
    #[arg(long = "mlx-cache-limit")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlx_cache_limit: Option<f64>,
    /// Temperature for requests that give none (default: the model's generation_config.json, else 1)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temp: Option<f32>,
    /// top_p for requests that give none
    #[arg(long = "top-p")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// top_k for requests that give none
    #[arg(long = "top-k")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// min_p for requests that give none
    #[arg(long = "min-p")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// repetition_penalty for requests that give none
    #[arg(long = "repetition-penalty")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Seconds a stream may stay silent before it sends an SSE comment (`: keep-alive`); 0 = never (default 5).
    #[arg(long = "sse-keepalive", value_name = "SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sse_keepalive: Option<u64>,
    /// Seconds a request's head may take to arrive (an idle keep-alive connection's wait
    /// included: the connection closes), and seconds its body may go without a byte (a 408);
    /// 0 = no deadline (default 30).
    #[arg(long = "read-timeout", value_name = "SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_timeout: Option<u64>,
    /// The reasoning switch for requests that do not set it, on models whose template has one
    /// (`enable_thinking`): `template` (the template's own default), `on` or `off`.
    #[arg(long = "thinking", value_name = "template|on|off")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<ThinkingArg>,
    /// Keep past reasoning in the history (`preserve_thinking: true`) for templates that read
    /// it, so an agent loop's earlier turns render the same way every turn.
    #[arg(long = "preserve-thinking")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub preserve_thinking: bool,
    /// Rewrite every system prompt before rendering (repeatable): a built-in rule by name
    /// (`claude-billing-header`), `regex:PATTERN` (matches removed) or
    /// `regex:PATTERN=>REPLACEMENT`. For agent harnesses that put per-request noise at the top
    /// of the system prompt, which otherwise defeats the prefix cache.
    #[arg(long = "system-prompt-rule", value_name = "RULE")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system_prompt_rule: Vec<String>,
    /// Seconds a stored /v1/responses response can be continued (previous_response_id) or read back (default 3600).
    #[arg(long = "responses-ttl")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responses_ttl: Option<u64>,
    /// MiB that stored /v1/responses responses may hold together; the oldest leave first (default 64).
    #[arg(long = "responses-store")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responses_store: Option<f64>,
    /// Run the engine (model, plugins, MLX) in a child process: when it dies (a crash, an
    /// abort, an out-of-memory kill) its requests fail with a clear error, the server keeps
    /// serving, and a new engine process starts (with a back-off while they keep dying).
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub isolate: bool,
    /// With --isolate and --ssd-cache: every N generated tokens a running request's state is
    /// stored in the prefix cache and its SSD tier, and a request whose engine process died
    /// continues in the next one from the tokens it had streamed (the client's stream goes on).
    #[arg(long = "generation-checkpoint", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_checkpoint: Option<usize>,
    /// Serve POST /debug/hold and /debug/release: pause the engine's loop (tests arrange concurrency with it).
    #[arg(long = "debug-endpoints")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub debug_endpoints: bool,
    #[command(flatten)]
    #[serde(flatten)]
    pub draft: crate::draft_cmd::DraftArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub kv: crate::kv_cmd::KvArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub tp: crate::tp_launch::TpArgs,
}

/// What `--tp` serves: no SSD tier or engine isolation. Checked before any
/// rank starts.
fn check_tp(a: &ServeArgs) -> Result<()> {
    let ranks = a.tp.ranks();
    if ranks <= 1 {
        return Ok(());
    }
    if a.ssd_cache.is_some() {
        bail!("--tp {ranks}: the SSD prefix tier is not served with --tp");
    }
    if a.isolate {
        bail!("--tp {ranks}: engine isolation (--isolate) is not served with --tp");
    }
    Ok(())
}

/// Flags over the file: the file's table, overlaid with every flag given.
fn merge(a: ServeArgs) -> Result<ServeArgs> {
    let Some(path) = a.config.clone() else { return Ok(a) };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let file: toml::Table = toml::from_str(&text).with_context(|| format!("{}: invalid config", path.display()))?;
    let known: Vec<String> = ServeArgs::augment_args(clap::Command::new("serve"))
        .get_arguments()
        .map(|arg| arg.get_id().as_str().to_owned())
        .filter(|id| id != "config")
        .collect();
    if let Some(unknown) = file.keys().find(|k| !known.contains(k)) {
        bail!("{}: unknown option `{unknown}` (known: {})", path.display(), known.join(", "));
    }
    let mut merged = serde_json::to_value(file)?;
    let flags = serde_json::to_value(&a)?;
    if let (Some(m), serde_json::Value::Object(f)) = (merged.as_object_mut(), flags) {
        m.extend(f);
    }
    let mut out: ServeArgs =
        serde_json::from_value(merged).with_context(|| format!("{}: invalid config", path.display()))?;
    out.config = a.config;
    Ok(out)
}

fn stage(n: usize, total: usize, what: &str, t0: Instant) {
    let done = "#".repeat(n * 20 / total);
    eprintln!("[{done:<20}] {n}/{total} {what} ({:.1}s)", t0.elapsed().as_secs_f64());
}

/// A size in GiB, as the flags give it, in bytes.
pub(crate) fn bytes_of_gib(g: f64) -> u64 {
    (g * (1u64 << 30) as f64) as u64
}

pub fn run(args: ServeArgs) -> Result<std::process::ExitCode> {
    let a = merge(args)?;
    check_tp(&a)?;
    let check = |n| match &a.model {
        Some(m) => crate::tp_launch::check_model(a.plugins.as_deref().unwrap_or("plugins".as_ref()), m, n),
        None => Ok(()),
    };
    let ranks = match crate::tp_launch::start(&a.tp, check)? {
        crate::tp_launch::Role::Launched(code) => return Ok(code),
        crate::tp_launch::Role::Alone => 1,
        crate::tp_launch::Role::Rank { ranks } => ranks,
    };
    let t0 = Instant::now();
    let Some(model_dir) = a.model.clone() else { bail!("--model DIR is required (or `model` in the --config file)") };
    // Checked before the model loads: a typo fails at once.
    let system_rules = SystemRules::parse(&a.system_prompt_rule).map_err(anyhow::Error::msg)?;
    if let Some(n) = a.generation_checkpoint {
        if n == 0 || !a.isolate || a.ssd_cache.is_none() {
            bail!("--generation-checkpoint N needs N >= 1, --isolate (a generation resumes in a new engine process) and --ssd-cache DIR (where its checkpoints are kept)");
        }
    }
    let cfg = server_config(&a, &model_dir, system_rules);
    let (worker, served) = if a.isolate {
        crate::isolate_cmd::start(&a, &model_dir)?
    } else {
        let loaded = load(&a, &model_dir, t0, ranks)?;
        let lockstep = if ranks > 1 { Some(host_engine::lockstep::Lockstep::current()?) } else { None };
        if let Some(lock) = lockstep.as_ref().filter(|l| l.rank() > 0) {
            // A follower serves nothing: it runs what rank 0's worker runs.
            eprintln!("rank {} of {ranks}: following rank 0", lock.rank());
            let memory = Some((loaded.memory, loaded.budget));
            host_engine::worker::follow(&loaded.engine, cfg.batch, memory, lockstep.unwrap());
            return Ok(std::process::ExitCode::SUCCESS);
        }
        let served = Served {
            text: loaded.engine.text().cloned(),
            planner: loaded.engine.planner(cfg.batch),
            info: loaded.info,
            memory: loaded.memory,
            budget: loaded.budget,
        };
        let worker = match lockstep {
            Some(lock) => {
                let memory = Some((loaded.memory, loaded.budget));
                Worker::start_lockstep(loaded.engine, cfg.queue, cfg.batch, memory, lock)
            }
            None => Worker::start(loaded.engine, cfg.queue, cfg.batch, Some((loaded.memory, loaded.budget))),
        };
        (worker, served)
    };
    stage(4, 4, &format!("ready: serving `{}` on http://{}:{}", cfg.model_id, cfg.host, cfg.port), t0);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let Served { text, info, planner, memory, budget } = served;
    rt.block_on(host_server::serve(cfg, worker, text, info, planner, memory, budget))?;
    Ok(std::process::ExitCode::SUCCESS)
}

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

/// Rows per decode step when `--batch` is not given: mlx_lm.server's
/// decode concurrency. On the CPU at 16 clients a default of 8 left half of
/// them waiting (0.80x of mlx_lm.server's aggregate; 0.99x at 32,
/// docs/benchmarks.md); admission still bounds the rows by memory.
const DEFAULT_BATCH: usize = 32;

/// Rows per decode step as configured.
pub fn batch(a: &ServeArgs) -> usize {
    a.batch.unwrap_or(DEFAULT_BATCH).max(1)
}

/// Requests that may wait as configured.
pub fn queue(a: &ServeArgs) -> usize {
    a.queue.unwrap_or(64)
}

/// Discovers the plugins, loads the model, reads its weights once and
/// sets MLX's buffer cache limit (stages 0 to 3 of the progress lines).
/// `ranks`: the tensor-parallel ranks this process is one of (1: alone).
pub fn load(a: &ServeArgs, model_dir: &std::path::Path, t0: Instant, ranks: usize) -> Result<Loaded> {
    let plugins = a.plugins.clone().unwrap_or_else(|| PathBuf::from("plugins"));
    stage(0, 4, "discovering plugins", t0);
    let reg = crate::registry(&plugins)?;
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

fn server_config(a: &ServeArgs, model_dir: &std::path::Path, system_rules: SystemRules) -> ServerConfig {
    let model_id = a.model_id.clone().unwrap_or_else(|| {
        model_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
    });
    ServerConfig {
        host: a.host.clone().unwrap_or_else(|| "127.0.0.1".into()),
        port: a.port.unwrap_or(8080),
        api_key: a.api_key.clone(),
        body_limit: a.body_limit.unwrap_or(4 << 20),
        queue: queue(a),
        default_max_tokens: a.max_tokens.unwrap_or(512),
        batch: batch(a),
        debug_endpoints: a.debug_endpoints,
        sse_keepalive: Some(a.sse_keepalive.unwrap_or(5)).filter(|&s| s > 0).map(std::time::Duration::from_secs),
        read_timeout: Some(a.read_timeout.unwrap_or(30)).filter(|&s| s > 0).map(std::time::Duration::from_secs),
        defaults: SamplingDefaults {
            temperature: a.temp,
            top_p: a.top_p,
            top_k: a.top_k,
            min_p: a.min_p,
            repetition_penalty: a.repetition_penalty,
        },
        model_id,
        responses_ttl: std::time::Duration::from_secs(a.responses_ttl.unwrap_or(3600)),
        responses_store_bytes: (a.responses_store.unwrap_or(64.0).max(0.0) * (1u64 << 20) as f64) as usize,
        thinking: match a.thinking.unwrap_or(ThinkingArg::Template) {
            ThinkingArg::Template => ThinkingDefault::Template,
            ThinkingArg::On => ThinkingDefault::On,
            ThinkingArg::Off => ThinkingDefault::Off,
        },
        preserve_thinking: a.preserve_thinking,
        system_rules,
    }
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

/// `--thinking`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkingArg {
    Template,
    On,
    Off,
}
