//! Liveness (the process answers) and readiness (the store answers and can write).

use axum::extract::State;
use axum::http::StatusCode;

use crate::state::AppState;

/// Liveness: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: the store answers and can write.
///
/// PostgreSQL is neither a standby nor read-only; SQLite's file is writable. A load balancer
/// takes a replica that answers 503 out.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = String), (status = 503, body = String)))]
pub(crate) async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    match state.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready\n"),
        Err(e) => {
            tracing::warn!(error = %e, "not ready: the store does not answer or cannot write");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
        }
    }
}
