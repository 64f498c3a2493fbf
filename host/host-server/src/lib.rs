//! The HTTP API: OpenAI's chat completions, completions and Responses,
//! and Anthropic's Messages.
//!
//! Owns: routes, the wire formats (parsed by hand into engine types), SSE
//! streaming, errors in each API's JSON shape with the right status,
//! API-key auth, body limits, the bounded queue's 503, stored responses,
//! graceful shutdown. Never imports plugin-api or names a model family: it
//! talks to the engine worker only.

mod answer;
mod assemble;
mod assistant_turn;
mod auth;
mod body_read;
mod choice;
mod embed_wire;
pub mod error;
mod fim;
mod gen;
mod keepalive;
mod listen;
mod page;
mod prompt;
pub mod reasoning;
mod respond;
mod response_store;
mod routes;
mod sse;
pub mod state;
mod structured;
pub mod system_rules;
mod tool_plan;
mod unpaired;
mod wire;

use crate::error::{shaped_for, ApiError};
use crate::state::{AppState, ModelInfo, ServerConfig, ServerStats};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::Uri;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use host_engine::tokenizer::TextSide;
use host_engine::worker::Worker;
use std::sync::Arc;

pub use state::SamplingDefaults;

pub fn router(st: AppState) -> Router {
    let limit = st.cfg.body_limit;
    Router::new()
        .route("/v1/chat/completions", post(routes::chat::handler))
        .route("/v1/completions", post(routes::completions::handler))
        .route("/v1/embeddings", post(routes::embeddings::handler))
        .route("/v1/messages", post(routes::anthropic::create))
        .route("/v1/messages/count_tokens", post(routes::anthropic::count_tokens))
        .route("/v1/responses", post(routes::responses::create))
        .route("/v1/responses/{id}", get(routes::responses::retrieve).delete(routes::responses::delete))
        .route("/v1/models", get(routes::info::models))
        .merge(page::routes())
        .route("/health", get(routes::info::health))
        .route("/stats", get(routes::info::stats))
        .route("/metrics", get(routes::metrics::metrics))
        .route("/debug/hold", post(routes::debug::hold))
        .route("/debug/release", post(routes::debug::release))
        .fallback(|uri: Uri| async move { shaped_for(uri.path(), ApiError::not_found("no such endpoint")) })
        .method_not_allowed_fallback(|uri: Uri| async move { shaped_for(uri.path(), ApiError::method_not_allowed()) })
        .layer(middleware::from_fn_with_state(st.clone(), guard))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(st)
}

/// Auth, an API body read whole (its size and stall errors), plain-text
/// rejections reshaped into the path's API JSON shape, and counters,
/// around every route.
async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    ServerStats::bump(&st.stats.http_requests);
    let path = req.uri().path().to_owned();
    let refuse = |e: ApiError| {
        ServerStats::bump(&st.stats.client_errors);
        shaped_for(&path, e)
    };
    let api = path.starts_with("/v1/");
    if let Some(key) = &st.cfg.api_key {
        if api && !auth::has_key(&req, key) {
            return refuse(ApiError::unauthorized());
        }
    }
    let declared =
        req.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > st.cfg.body_limit) {
        return refuse(ApiError::too_large(st.cfg.body_limit));
    }
    // The API's bodies (after auth); no other route reads one, so theirs
    // are left unread.
    let req = if api {
        let (parts, body) = req.into_parts();
        match body_read::read_whole(body, st.cfg.body_limit, st.cfg.read_timeout).await {
            Ok(b) => Request::from_parts(parts, b.into()),
            Err(e) => return refuse(e),
        }
    } else {
        req
    };
    let resp = next.run(req).await;
    let status = resp.status();
    if status.is_client_error() {
        ServerStats::bump(&st.stats.client_errors);
        if resp.headers().get("content-type").is_none_or(|v| v.as_bytes().starts_with(b"text/plain")) {
            // An extractor's plain-text rejection (a query string
            // `/debug/release` cannot parse): the same status in the
            // path's shape. (API bodies fail in `body_read`, shaped.)
            let text = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap_or_default();
            let message = String::from_utf8_lossy(&text).trim().to_owned();
            return shaped_for(&path, ApiError::client(status, message));
        }
    }
    resp
}

/// Serves until SIGINT/SIGTERM; then stops accepting, cancels in-flight
/// generation (each job ends within a decode step) and returns.
pub async fn serve(
    cfg: ServerConfig,
    worker: Worker,
    text: Option<Arc<TextSide>>,
    info: ModelInfo,
    planner: host_engine::plan::Planner,
    memory: host_engine::admission::MemoryModel,
    budget: host_engine::admission::Budget,
) -> std::io::Result<()> {
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let worker = Arc::new(worker);
    let tools = Arc::new(state::ToolSupport::detect(text.as_deref()));
    tracing::info!(syntax = tools.syntax.name(), "tool calls");
    let reasoning = Arc::new(match text.as_deref() {
        Some(t) => reasoning::ReasoningSupport::detect(t.template_source().unwrap_or(""), &t.added_tokens()),
        None => Default::default(),
    });
    tracing::info!(
        markers = reasoning.markers.as_ref().map_or("none", |m| m.end),
        switch = reasoning.switch,
        preserve = reasoning.preserve,
        "reasoning"
    );
    if let Some(t) = text.clone() {
        // The token trie behind every grammar, built before the first
        // constrained request needs it.
        std::thread::spawn(move || {
            if let Err(e) = t.grammar() {
                tracing::warn!(error = %e, "constrained decoding is unavailable");
            }
        });
    }
    let responses = Arc::new(response_store::ResponseStore::new(cfg.responses_ttl, cfg.responses_store_bytes));
    let st = AppState {
        planner: Arc::new(planner),
        memory,
        budget,
        worker: worker.clone(),
        text,
        tools,
        reasoning,
        info,
        cfg: Arc::new(cfg),
        stats: Arc::new(ServerStats::default()),
        ids: Arc::new(Default::default()),
        responses,
    };
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    let w = worker.clone();
    let head_timeout = st.cfg.read_timeout;
    listen::serve_until(listener, router(st), head_timeout, async move {
        shutdown_signal().await;
        tracing::info!("shutting down: cancelling in-flight generation");
        w.cancel_all();
    })
    .await;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
