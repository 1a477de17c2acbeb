//! `GET /api/v1/agent/tunnel`: an agent upgrades its connection (on its mutual-TLS identity
//! and node credential) to the tunnel its instances are entered through.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gpurent_types::api::ErrorBody;

use crate::auth::AgentNode;
use crate::error::ApiError;
use crate::routes::agent::check_node_cert;
use crate::state::AppState;
use crate::tls::PeerCert;

/// Upgrade to the tunnel (`Upgrade: gpurent-tunnel/1`; reverse HTTP/2 follows, with the
/// control plane as the client). An agent holds one open while it runs, so that tenants'
/// SSH sessions reach its instances with no inbound port on the node.
#[utoipa::path(get, path = "/api/v1/agent/tunnel", tag = "agent",
    security(("bearer" = [])),
    responses((status = 101, description = "the tunnel follows"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody)))]
pub(crate) async fn tunnel(
    State(state): State<AppState>,
    AgentNode(node_id): AgentNode,
    peer: PeerCert,
    request: Request,
) -> Result<Response, ApiError> {
    check_node_cert(&state, &node_id, &peer).await?;
    let asks = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(gpurent_tunnel::UPGRADE));
    if !asks {
        return Err(ApiError::Invalid(format!(
            "the tunnel needs the header Upgrade: {}",
            gpurent_tunnel::UPGRADE
        )));
    }
    let node = state.store.node_name(&node_id).await?;
    let upgrade = hyper::upgrade::on(request);
    let tunnels = state.tunnels.clone();
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => tunnels.serve(node, upgraded).await,
            Err(e) => tracing::warn!(%node, error = %e, "tunnel: upgrade failed"),
        }
    });
    Ok((
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, HeaderValue::from_static("upgrade")),
            (
                header::UPGRADE,
                HeaderValue::from_static(gpurent_tunnel::UPGRADE),
            ),
        ],
    )
        .into_response())
}
