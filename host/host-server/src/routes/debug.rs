//! `POST /debug/hold`, `POST /debug/release[?steps=N]`: pause the engine's
//! loop between iterations and let it go (all of it, or N more decode
//! steps), so a test can arrange concurrency exactly: queue requests while
//! held and see them admitted together, or let a request run N steps and
//! join another to it. `/stats` reports `hold.held` and `hold.parked` (the
//! loop is waiting at the hold). Served only with `--debug-endpoints`.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Query, State};
use axum::Json;
use serde_json::{json, Value};

fn enabled(st: &AppState) -> Result<(), ApiError> {
    if st.cfg.debug_endpoints {
        Ok(())
    } else {
        Err(ApiError::not_found("no such endpoint (the /debug endpoints need `host serve --debug-endpoints`)"))
    }
}

pub async fn hold(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    enabled(&st)?;
    st.worker.hold();
    Ok(Json(json!({ "held": true })))
}

#[derive(serde::Deserialize)]
pub struct Release {
    steps: Option<u64>,
}

pub async fn release(State(st): State<AppState>, Query(q): Query<Release>) -> Result<Json<Value>, ApiError> {
    enabled(&st)?;
    st.worker.release(q.steps);
    Ok(Json(json!({ "held": st.worker.held(), "steps": q.steps })))
}
