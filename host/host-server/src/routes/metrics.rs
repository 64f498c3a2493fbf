//! `GET /metrics` in Prometheus text format.

use crate::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use host_engine::histogram::{TOKENS_PER_SECOND, TTFT_SECONDS};
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ =
        writeln!(out, "# HELP mlx_engine_{name} {help}\n# TYPE mlx_engine_{name} {kind}\nmlx_engine_{name} {value}");
}

pub async fn metrics(State(st): State<AppState>) -> impl IntoResponse {
    let worker = st.worker.clone();
    let _ = tokio::task::spawn_blocking(move || worker.refresh_stats()).await;
    let w = &st.worker.stats;
    let s = &st.stats;
    let mlx = st.worker.mlx_memory();
    let mut o = String::new();
    metric(&mut o, "queue_depth", "gauge", "Requests waiting for the engine.", w.queued.load(Relaxed));
    metric(&mut o, "active_rows", "gauge", "Requests being prefilled or decoded.", w.active.load(Relaxed));
    metric(&mut o, "requests_total", "counter", "Requests the engine started.", w.requests.load(Relaxed));
    metric(
        &mut o,
        "requests_completed_total",
        "counter",
        "Requests that ran to EOS or max_tokens.",
        w.completed.load(Relaxed),
    );
    metric(
        &mut o,
        "requests_cancelled_total",
        "counter",
        "Requests stopped by their caller (disconnect, stop string, shutdown).",
        w.cancelled.load(Relaxed),
    );
    metric(&mut o, "requests_failed_total", "counter", "Requests that failed in the engine.", w.failed.load(Relaxed));
    metric(&mut o, "prompt_tokens_total", "counter", "Prompt tokens received.", w.prompt_tokens.load(Relaxed));
    metric(&mut o, "generated_tokens_total", "counter", "Tokens generated.", w.generated_tokens.load(Relaxed));
    metric(&mut o, "decode_steps_total", "counter", "Batched decode steps run.", w.decode_steps.load(Relaxed));
    metric(
        &mut o,
        "pipelined_steps_total",
        "counter",
        "Batched decode steps queued before the previous step's tokens were read.",
        w.pipelined_steps.load(Relaxed),
    );
    let (masks, mask_s, accept_s) = st.text.as_ref().map_or((0, 0.0, 0.0), |t| t.mask_clock.totals());
    metric(
        &mut o,
        "grammar_masks_total",
        "counter",
        "Grammar masks the matchers computed (about one per constrained row and step; none inside a reasoning block).",
        masks,
    );
    metric(&mut o, "grammar_mask_seconds_total", "counter", "CPU time spent computing grammar masks.", mask_s);
    metric(&mut o, "grammar_accept_seconds_total", "counter", "CPU time spent moving grammars past tokens.", accept_s);
    metric(
        &mut o,
        "prefill_tokens_per_second",
        "gauge",
        "Prefill rate of the last finished request.",
        f64::from_bits(w.last_prefill_tps.load(Relaxed)),
    );
    metric(
        &mut o,
        "decode_tokens_per_second",
        "gauge",
        "Decode rate of the last finished request.",
        f64::from_bits(w.last_decode_tps.load(Relaxed)),
    );
    metric(
        &mut o,
        "prefix_cache_hits_total",
        "counter",
        "Requests that reused cached prompt state.",
        w.prefix_hits.load(Relaxed),
    );
    metric(
        &mut o,
        "prefix_cache_misses_total",
        "counter",
        "Requests that found no reusable prompt state.",
        w.prefix_misses.load(Relaxed),
    );
    metric(
        &mut o,
        "prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        w.prefix_hit_tokens.load(Relaxed),
    );
    metric(&mut o, "prefix_cache_bytes", "gauge", "Bytes held by the prefix cache.", w.prefix_bytes.load(Relaxed));
    metric(&mut o, "prefix_cache_entries", "gauge", "Entries in the prefix cache.", w.prefix_entries.load(Relaxed));
    if let Some(h) = st.worker.engine_health() {
        let up = u8::from(h.state == "running");
        metric(&mut o, "engine_up", "gauge", "1 while an isolated engine process serves.", up);
        metric(&mut o, "engine_restarts_total", "counter", "Isolated engine processes that ended.", h.restarts);
        let backoff = h.next_start_in_s.unwrap_or(0.0);
        metric(&mut o, "engine_backoff_seconds", "gauge", "The wait before the next engine process starts.", backoff);
    }
    for (name, kind, help, value) in w.ssd.iter().flat_map(|c| c.fields()) {
        let total = if kind == "counter" { "_total" } else { "" };
        metric(&mut o, &format!("ssd_cache_{name}{total}"), kind, help, value);
    }
    metric(
        &mut o,
        "mlx_active_bytes",
        "gauge",
        "Bytes MLX holds in live arrays (weights, caches, prefix cache, transients).",
        mlx[0],
    );
    metric(
        &mut o,
        "mlx_cache_bytes",
        "gauge",
        "Bytes of freed buffers MLX keeps for reuse (bounded by --mlx-cache-limit).",
        mlx[1],
    );
    metric(&mut o, "mlx_peak_bytes", "gauge", "The most bytes MLX held in live arrays since start.", mlx[2]);
    metric(&mut o, "mlx_cache_limit_bytes", "gauge", "MLX's buffer cache limit.", st.budget.mlx_cache_bytes);
    metric(
        &mut o,
        "memory_budget_bytes",
        "gauge",
        "The memory budget requests are admitted against.",
        st.budget.memory_bytes,
    );
    metric(
        &mut o,
        "admission_refusals_total",
        "counter",
        "Requests refused because they could never fit in memory.",
        w.admission_refusals.load(Relaxed),
    );
    metric(&mut o, "http_requests_total", "counter", "HTTP requests received.", s.http_requests.load(Relaxed));
    metric(&mut o, "http_client_errors_total", "counter", "HTTP 4xx answers.", s.client_errors.load(Relaxed));
    metric(
        &mut o,
        "client_disconnects_total",
        "counter",
        "Clients gone before their response ended.",
        s.client_disconnects.load(Relaxed),
    );
    w.ttft.render(
        &mut o,
        "mlx_engine_time_to_first_token_seconds",
        "Time from request start to its first token.",
        TTFT_SECONDS,
    );
    w.prefill_rate.render(
        &mut o,
        "mlx_engine_request_prefill_tokens_per_second",
        "Per request: prompt tokens / time to first token.",
        TOKENS_PER_SECOND,
    );
    w.decode_rate.render(
        &mut o,
        "mlx_engine_request_decode_tokens_per_second",
        "Per request: tokens/s after the first token.",
        TOKENS_PER_SECOND,
    );
    metric(
        &mut o,
        "cohort_prefills_total",
        "counter",
        "Bursts of new requests prefilled as one padded batch.",
        w.cohorts.load(Relaxed),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], o)
}
