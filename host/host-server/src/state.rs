//! What every handler shares: the engine worker, the model's text side and
//! limits, the server's configuration and counters.

use host_engine::tokenizer::TextSide;
use host_engine::worker::Worker;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Sampling defaults given on the command line (they override
/// generation_config.json; a request overrides them).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// Largest accepted request body in bytes.
    pub body_limit: usize,
    /// Requests waiting for the engine before new ones get 503.
    pub queue: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// Rows per decode step (1 = strict serial).
    pub batch: usize,
    /// Serve `/debug/*` (the engine loop's hold, for tests and operators).
    pub debug_endpoints: bool,
    /// A stream that has sent nothing for this long sends an SSE comment
    /// (proxies and clients drop connections that stay silent); None: never.
    pub sse_keepalive: Option<std::time::Duration>,
    /// How long a request's head may take to arrive, and how long its body
    /// may go without a byte; None: no deadline.
    pub read_timeout: Option<std::time::Duration>,
    pub defaults: SamplingDefaults,
    pub model_id: String,
    /// How long a stored response can be continued or read back.
    pub responses_ttl: std::time::Duration,
    /// Bytes all stored responses may hold together.
    pub responses_store_bytes: usize,
    /// The reasoning switch for requests that leave it unset.
    pub thinking: crate::reasoning::ThinkingDefault,
    /// Keep past reasoning in the history where the template can.
    pub preserve_thinking: bool,
    /// Rewrites of system prompts (per-request noise out of the prefix).
    pub system_rules: crate::system_rules::SystemRules,
}

/// Facts about the served model the HTTP layer needs.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub max_context: usize,
    pub vocab_size: u32,
    pub hidden_size: usize,
    /// How the folder pools hidden states into embeddings, or why it serves none.
    pub embeddings: Result<host_engine::pooling::Pooling, host_engine::pooling::PoolingError>,
}

#[derive(Default)]
pub struct ServerStats {
    pub http_requests: AtomicU64,
    pub client_errors: AtomicU64,
    pub client_disconnects: AtomicU64,
    pub stop_string_hits: AtomicU64,
}

impl ServerStats {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone)]
pub struct AppState {
    /// What each request's execution plan depends on besides the request
    /// (the engine's capabilities and features), to resolve it once.
    pub planner: Arc<host_engine::plan::Planner>,
    /// Memory admission: what a request costs, and what the server allows.
    pub memory: host_engine::admission::MemoryModel,
    pub budget: host_engine::admission::Budget,
    pub worker: Arc<Worker>,
    pub text: Option<Arc<TextSide>>,
    /// How the model writes tool calls (from its chat template and added
    /// tokens), and those tokens (grammars name special markers by id).
    pub tools: Arc<ToolSupport>,
    /// How the model writes reasoning (from its chat template and added tokens).
    pub reasoning: Arc<crate::reasoning::ReasoningSupport>,
    pub info: ModelInfo,
    pub cfg: Arc<ServerConfig>,
    pub stats: Arc<ServerStats>,
    pub ids: Arc<AtomicU64>,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: Arc<crate::response_store::ResponseStore>,
}

/// What tool calling needs to know about the served model.
pub struct ToolSupport {
    pub syntax: host_tools::ToolSyntax,
    pub added_tokens: Vec<(u32, String, bool)>,
    /// The chat template reads messages' `tool_calls` (it renders past calls
    /// itself); otherwise they are handed to it as text (`inline_calls`).
    pub template_renders_calls: bool,
}

impl ToolSupport {
    pub fn detect(text: Option<&TextSide>) -> Self {
        let added_tokens = text.map(TextSide::added_tokens).unwrap_or_default();
        let named: Vec<(String, bool)> = added_tokens.iter().map(|(_, t, s)| (t.clone(), *s)).collect();
        let template = text.and_then(TextSide::template_source).unwrap_or("");
        Self {
            syntax: host_tools::ToolSyntax::detect(template, &named),
            added_tokens,
            template_renders_calls: template.contains("tool_calls"),
        }
    }
}

impl AppState {
    pub fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.ids.fetch_add(1, Ordering::Relaxed))
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
