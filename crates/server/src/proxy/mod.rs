//! Published HTTP ports, forwarded to that port inside the reservation's instance through its
//! node's tunnel, for the reservation's owner only. Browsers reach an app on the apps' site
//! (`ID-PORT.APPS-DOMAIN`, an origin of its own that shares no cookie with the console), by a
//! cookie that a one-time ticket set there; the console's site keeps `/proxy/{id}/{port}/` for
//! bearer-token clients only, sandboxed and without cookies.

pub(crate) mod access;
pub(crate) mod forward;
pub(crate) mod host;
pub(crate) mod links;
pub(crate) mod open;
pub(crate) mod pool;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use gpurent_store::Scope;
use gpurent_types::api::{HttpEndpoint, Reservation};
use gpurent_types::ReservationStatus;

use crate::error::ApiError;
use crate::state::AppState;

/// Where the proxy's routes start.
pub const PREFIX: &str = "/proxy/";

/// The query parameter of a one-time link.
const LINK_PARAM: &str = "gpurent_link";

/// Whether a request goes to the proxy: it may stream its body as long as its app wants (an
/// upload, a WebSocket), so the listener's body deadline does not apply.
pub(crate) fn is_proxied(uri: &Uri, headers: &axum::http::HeaderMap, apps_domain: &str) -> bool {
    uri.path().starts_with(PREFIX)
        || uri.path().starts_with(crate::endpoints::serve::PREFIX)
        || host::target(headers, apps_domain).is_some()
        || host::endpoint(headers, apps_domain).is_some()
}

/// A reservation's port as a request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    reservation_id: String,
    port: u16,
}

impl Target {
    /// `/proxy/ID/PORT` or `/proxy/ID/PORT/...`; also whether the slash after PORT is there.
    fn parse(path: &str) -> Option<(Target, bool)> {
        let rest = path.strip_prefix(PREFIX)?;
        let (id, rest) = rest.split_once('/').unwrap_or((rest, ""));
        let (port, tail) = match rest.split_once('/') {
            Some((port, _)) => (port, true),
            None => (rest, false),
        };
        let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
        (!id.is_empty()).then(|| {
            (
                Target {
                    reservation_id: id.to_owned(),
                    port,
                },
                tail,
            )
        })
    }

    /// The prefix the app is published at on the control plane's own host.
    fn base_path(&self) -> String {
        format!("{PREFIX}{}/{}/", self.reservation_id, self.port)
    }
}

/// What anyone who may not reach a port gets, whatever the reason (an unknown reservation,
/// another tenant's, a port it does not publish, no credential): the same as for a path
/// that does not exist, so nothing is learnt by trying.
fn not_found(path: &str) -> Response {
    ApiError::NoRoute(path.to_owned()).into_response()
}

/// The reservation behind a target, if it runs and publishes the port.
async fn running(state: &AppState, target: &Target) -> Option<Reservation> {
    let r = state
        .store
        .get_reservation(&target.reservation_id, &Scope::All)
        .await
        .ok()?;
    (r.status == ReservationStatus::Running
        && r.node.is_some()
        && r.http_ports.contains(&target.port))
    .then_some(r)
}

/// The proxy: every method, every path below a published port. On the apps' site the owner
/// gets in with a ticket (which becomes a cookie there), that cookie or a bearer token; on the
/// console's site with a bearer token only: no cookie of that site ever opens an app.
pub(crate) async fn handle(State(state): State<AppState>, request: Request) -> Response {
    let via_host = request.extensions().get::<host::ViaHost>().cloned();
    let path = request.uri().path().to_owned();
    let Some((target, slash)) = Target::parse(&path) else {
        return not_found(&path);
    };
    if !slash && via_host.is_none() {
        let mut to = target.base_path();
        if let Some(q) = request.uri().query() {
            to = format!("{to}?{q}");
        }
        return redirect(StatusCode::PERMANENT_REDIRECT, &to, None);
    }
    let Some(reservation) = running(&state, &target).await else {
        return not_found(&path);
    };
    if let Some(via) = &via_host {
        if let Some(ticket) = access::link_param(request.uri()) {
            let uri = request.uri().clone();
            return access::redeem(&state, &target, &reservation, &uri, via, &ticket)
                .await
                .unwrap_or_else(|| not_found(&path));
        }
    }
    let site = match via_host {
        Some(_) => access::Site::Apps,
        None => access::Site::Console,
    };
    if !access::allowed(&state, &target, &reservation, request.headers(), site).await {
        return not_found(&path);
    }
    crate::audit::note_caller(request.extensions(), &reservation.tenant_id);
    state
        .activity
        .touch(&state.store, &reservation.id, state.now());
    forward::forward(&state, &target, &reservation, request, via_host).await
}

fn redirect(status: StatusCode, to: &str, cookie: Option<String>) -> Response {
    let mut response = status.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    if let Some(v) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

/// `http` or `https`, as the control plane's listener speaks.
pub(crate) fn scheme(state: &AppState) -> &'static str {
    if state.config.tls.is_some() {
        "https"
    } else {
        "http"
    }
}

/// The host the client reached the control plane at (its `Host` header).
pub(crate) fn request_host(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
}

/// Where a running reservation's HTTP ports are reachable (`get`'s `"http"`), at the host the
/// client asked on.
pub(crate) fn endpoints(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    r: &Reservation,
) -> Vec<HttpEndpoint> {
    let Some(host) = request_host(headers) else {
        return Vec::new();
    };
    if r.status != ReservationStatus::Running {
        return Vec::new();
    }
    r.http_ports
        .iter()
        .map(|&port| HttpEndpoint {
            port,
            url: format!("{}://{host}{PREFIX}{}/{port}/", scheme(state), r.id),
            app_url: app_url(state, host, &r.id, port),
        })
        .collect()
}

/// Where a browser finds a port on the apps' site: `ID-PORT.APPS-DOMAIN`, at the port of the
/// listener the client reached (`host`, the request's `Host`).
pub(crate) fn app_url(state: &AppState, host: &str, id: &str, port: u16) -> String {
    format!(
        "{}://{id}-{port}.{}{}/",
        scheme(state),
        state.config.apps_domain.trim_matches('.'),
        listener_port(host)
    )
}

/// `:PORT` of a `Host` value that names one, else nothing: the same listener on another name.
pub(crate) fn listener_port(host: &str) -> String {
    host.rsplit_once(':')
        .filter(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .map(|(_, p)| format!(":{p}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_read_from_the_path() {
        let t = |id: &str, port| Target {
            reservation_id: id.into(),
            port,
        };
        assert_eq!(
            Target::parse("/proxy/r1/8888/"),
            Some((t("r1", 8888), true))
        );
        assert_eq!(
            Target::parse("/proxy/r1/8888/lab/tree?x"),
            Some((t("r1", 8888), true))
        );
        assert_eq!(
            Target::parse("/proxy/r1/8888"),
            Some((t("r1", 8888), false))
        );
        assert_eq!(Target::parse("/proxy/r1/0/"), None);
        assert_eq!(Target::parse("/proxy/r1/99999/"), None);
        assert_eq!(Target::parse("/proxy//8888/"), None);
        assert_eq!(Target::parse("/proxy/r1/"), None);
        assert_eq!(Target::parse("/api/v1/x"), None);
    }
}
