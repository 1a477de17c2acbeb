//! How tenants connect over SSH: the endpoint's address and host key (`GET /api/v1/ssh`),
//! and the `"ssh"` of a running reservation.

use axum::extract::State;
use axum::http::{header, HeaderMap, Uri};
use axum::Json;
use gpurent_types::api::{ErrorBody, Reservation, ReservationSsh};
use gpurent_types::ReservationStatus;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::ssh::{host_of, SshEndpointInfo};
use crate::state::AppState;

/// The host the client reached the API at: its Host header (HTTP/1.1) or the request's
/// authority (HTTP/2), without the port.
fn request_host<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Option<&'a str> {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(host_of)
        .or_else(|| uri.host())
}

/// The control plane's SSH endpoint: where to connect (`ssh -p PORT RESERVATION_ID@HOST`,
/// the host as given by `--ssh-advertise`, else the one this request was sent to) and the
/// host key to pin. 404 `no_ssh_endpoint` when it has none (`--ssh-listen`).
#[utoipa::path(get, path = "/api/v1/ssh", tag = "reservations", security(("bearer" = [])),
    responses((status = 200, body = SshEndpointInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn ssh_endpoint(
    State(state): State<AppState>,
    _caller: Caller,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Json<SshEndpointInfo>, ApiError> {
    let endpoint = state.ssh_endpoint.get().ok_or(ApiError::NoSshEndpoint)?;
    Ok(Json(endpoint.info(request_host(&headers, &uri))))
}

/// Adds the connection details to reservations that run, where there is an endpoint.
pub(crate) fn add_connection(
    state: &AppState,
    headers: &HeaderMap,
    uri: &Uri,
    reservations: &mut [Reservation],
) {
    let Some(endpoint) = state.ssh_endpoint.get() else {
        return;
    };
    let info = endpoint.info(request_host(headers, uri));
    for r in reservations
        .iter_mut()
        .filter(|r| r.status == ReservationStatus::Running)
    {
        r.ssh = Some(ReservationSsh {
            user: r.id.clone(),
            command: format!("ssh -p {} {}@{}", info.port, r.id, info.host),
            host: info.host.clone(),
            port: info.port,
        });
    }
}
