//! `host serve`'s options. Every option is declared once, here: clap reads
//! the flags, serde reads the same struct from the file (keys as the
//! flags, with `_`).

use clap::Args;
use std::path::PathBuf;

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

/// `--thinking`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkingArg {
    Template,
    On,
    Off,
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

/// A size in GiB, as the flags give it, in bytes.
pub(crate) fn bytes_of_gib(g: f64) -> u64 {
    (g * (1u64 << 30) as f64) as u64
}
