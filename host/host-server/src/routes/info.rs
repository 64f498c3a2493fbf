//! `GET /v1/models`, `GET /health`, `GET /stats`.

use crate::state::{unix_now, AppState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;

/// The served model, with its context length under both names clients
/// read (`context_length`; vLLM's `max_model_len`), null when unknown.
pub async fn models(State(st): State<AppState>) -> Json<Value> {
    let ctx = Some(st.info.max_context).filter(|&n| n > 0);
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.cfg.model_id,
            "object": "model",
            "created": unix_now(),
            "owned_by": "mlx-engine",
            "context_length": ctx,
            "max_model_len": ctx,
        }],
    }))
}

/// `ok`, or with `--isolate` while no engine process serves (one died and
/// the next is starting) `restarting` with 503; `engine` then says how the
/// engine process fares (restarts, how the last one ended, the back-off).
pub async fn health(State(st): State<AppState>) -> (StatusCode, Json<Value>) {
    match st.worker.engine_health() {
        None => (StatusCode::OK, Json(json!({ "status": "ok" }))),
        Some(h) => {
            let up = h.state == "running";
            let status = if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            (status, Json(json!({ "status": if up { "ok" } else { "restarting" }, "engine": h })))
        }
    }
}

/// Counters for operators and tests (e.g. that a disconnect cancelled work).
pub async fn stats(State(st): State<AppState>) -> Json<Value> {
    let worker = st.worker.clone();
    let _ = tokio::task::spawn_blocking(move || worker.refresh_stats()).await;
    let w = &st.worker.stats;
    let s = &st.stats;
    let mlx = st.worker.mlx_memory();
    let mut out = json!({
        "queued": w.queued.load(Relaxed),
        "active": w.active.load(Relaxed),
        "engine_idle": w.idle.load(Relaxed),
        "requests": w.requests.load(Relaxed),
        "completed": w.completed.load(Relaxed),
        "cancelled": w.cancelled.load(Relaxed),
        "failed": w.failed.load(Relaxed),
        "prompt_tokens": w.prompt_tokens.load(Relaxed),
        "generated_tokens": w.generated_tokens.load(Relaxed),
        "last_cancelled_tokens": w.last_cancelled_tokens.load(Relaxed),
        "decode_steps": w.decode_steps.load(Relaxed),
        "max_batch_rows": w.max_batch_rows.load(Relaxed),
        "pipelined_steps": w.pipelined_steps.load(Relaxed),
        "spec_replays": w.spec_replays.load(Relaxed),
        "spec_replays_padded": w.spec_replays_padded.load(Relaxed),
        "cohort_prefills": w.cohorts.load(Relaxed),
        "cohort_rows": w.cohort_rows.load(Relaxed),
        "http_requests": s.http_requests.load(Relaxed),
        "client_errors": s.client_errors.load(Relaxed),
        "client_disconnects": s.client_disconnects.load(Relaxed),
        "stop_string_hits": s.stop_string_hits.load(Relaxed),
        "hold": { "held": st.worker.held(), "parked": st.worker.parked() },
        "kv_reserved_bytes": w.kv_reserved.load(Relaxed),
        "generation_checkpoints": w.generation_checkpoints.load(Relaxed),
        "prefix_cache_bytes": w.prefix_bytes.load(Relaxed),
        "prefix_cache_entries": w.prefix_entries.load(Relaxed),
        "prefix_cache_hits": w.prefix_hits.load(Relaxed),
        "prefix_cache_hit_tokens": w.prefix_hit_tokens.load(Relaxed),
        "mlx_memory": {
            "active_bytes": mlx[0],
            "cache_bytes": mlx[1],
            "peak_bytes": mlx[2],
            "weights_bytes": st.memory.weights_bytes,
            "cache_limit_bytes": st.budget.mlx_cache_bytes,
            "budget_bytes": st.budget.memory_bytes,
        },
    });
    // The K/V block pool's counts, when the model's K/V are paged.
    let block_tokens = w.kv_block_tokens.load(Relaxed);
    if let (true, Some(o)) = (block_tokens > 0, out.as_object_mut()) {
        o.insert(
            "kv_pool".into(),
            json!({
                "block_tokens": block_tokens,
                "blocks": w.kv_blocks.load(Relaxed),
                "references": w.kv_block_references.load(Relaxed),
                "bytes": w.kv_block_bytes.load(Relaxed),
                "tail_tokens": w.kv_tail_tokens.load(Relaxed),
            }),
        );
    }
    // The SSD tier's counters, flat (`ssd_cache_hits`, ...), when it is on.
    if let (Some(c), Some(o)) = (&w.ssd, out.as_object_mut()) {
        o.extend(c.fields().iter().map(|&(name, _, _, v)| (format!("ssd_cache_{name}"), Value::from(v))));
    }
    Json(out)
}
