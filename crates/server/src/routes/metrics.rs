//! `GET /metrics`: Prometheus text for the control plane, without authentication like
//! `/healthz` (keep it off the public listener, or behind the proxy, where that matters).

use crate::metrics::CONTENT_TYPE;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// Prometheus metrics of the control plane (text format 0.0.4).
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, body = String, content_type = "text/plain; version=0.0.4")))]
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let view = state.store.metrics_view(state.live_since()).await?;
    let now = state.now();
    let endpoints = crate::endpoints::metrics::snapshot(&state.endpoints, now);
    let text = state.metrics.render(&view, endpoints, now);
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response())
}

/// Times every request of a matched route, labelled with the route's template.
pub(crate) async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    state.metrics.observe_request(
        &route,
        &method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}
