//! Forwarding one request to a port inside an instance: a TCP stream through the node's
//! tunnel, HTTP/1.1 over it, the response streamed back; a WebSocket (any `Upgrade`) is
//! spliced both ways once the app answers 101. Published ports and endpoints both forward
//! here (`forward_hop`).

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gpurent_tunnel::{OpenStream, StreamKind};
use gpurent_types::api::Reservation;
use hyper_util::rt::TokioIo;

use super::host::ViaHost;
use super::{access, Target};
use crate::error::ApiError;
use crate::metrics::SshCounts;
use crate::state::AppState;

/// Headers of one hop only (RFC 9110 7.6.1), never forwarded as they are.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Sends the request to the target port of the reservation's instance and streams the
/// answer back; 502 when the port cannot be reached.
pub(super) async fn forward(
    state: &AppState,
    target: &Target,
    reservation: &Reservation,
    request: Request,
    via_host: Option<ViaHost>,
) -> Response {
    let apps_site = via_host.is_some();
    let path = match via_host {
        Some(via) => via.path,
        None => request.uri().path().to_owned(),
    };
    let hop = Hop {
        reservation_id: &reservation.id,
        node: reservation.node.as_deref().unwrap_or_default(),
        epoch: reservation.epoch,
        port: target.port,
        path,
        apps_site,
    };
    forward_hop(state, &hop, request).await
}

/// Where one forwarded request goes: a port of a running instance, the path the app sees, and
/// which site the client is on (the apps' own, or the console's, sandboxed).
#[derive(Debug, Clone)]
pub(crate) struct Hop<'a> {
    pub reservation_id: &'a str,
    pub node: &'a str,
    pub epoch: i64,
    pub port: u16,
    pub path: String,
    pub apps_site: bool,
}

/// Marks a 502 of the proxy's own (the instance could not be reached or closed without an
/// answer), not one the app sent: the request reached no app and may be tried elsewhere.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unreached;

/// Sends the request to the hop's port and streams the answer back; 502 (marked
/// [`Unreached`]) when the port cannot be reached.
pub(crate) async fn forward_hop(state: &AppState, hop: &Hop<'_>, mut request: Request) -> Response {
    state.metrics.proxy.requests.fetch_add(1, Ordering::Relaxed);
    let upgrade = upgrade_of(request.headers());
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let outgoing = match outgoing(state, request, &hop.path, upgrade.as_ref()) {
        Ok(outgoing) => outgoing,
        Err(e) => return e.into_response(),
    };
    let bad_gateway = |why: String| {
        state
            .metrics
            .proxy
            .bad_gateway
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(reservation = %hop.reservation_id, port = hop.port, %why, "proxy: bad gateway");
        let mut response = ApiError::BadGateway(format!(
            "cannot reach port {} of reservation {}: {why}",
            hop.port, hop.reservation_id
        ))
        .into_response();
        response.extensions_mut().insert(Unreached);
        response
    };
    let key = super::pool::Key {
        node: hop.node.to_owned(),
        reservation_id: hop.reservation_id.to_owned(),
        epoch: hop.epoch,
        port: hop.port,
    };
    let mut outgoing = outgoing;
    // A kept connection first (never for an upgrade, whose connection becomes the stream); a
    // request it closed on before sending is sent again on a new one.
    while let Some(mut sender) = upgrade
        .is_none()
        .then(|| state.upstreams.take(&key))
        .flatten()
    {
        match sender.try_send_request(outgoing).await {
            Ok(response) => return answer(state, hop, response, Some((key, sender))),
            Err(mut e) => match e.take_message() {
                Some(unsent) => outgoing = unsent,
                None => {
                    return bad_gateway(format!(
                        "the app closed the connection without an answer ({})",
                        e.into_error()
                    ))
                }
            },
        }
    }
    let open = OpenStream {
        reservation_id: hop.reservation_id.to_owned(),
        epoch: hop.epoch,
        kind: StreamKind::Tcp { port: hop.port },
        pty: None,
        env: Vec::new(),
    };
    let stream = match state.tunnels.dial(hop.node, open).await {
        Ok(stream) => stream,
        Err(e) => return bad_gateway(e.to_string()),
    };
    let io = stream.into_io();
    let (mut sender, connection) = match hyper::client::conn::http1::Builder::new()
        .handshake::<_, Body>(TokioIo::new(io))
        .await
    {
        Ok(pair) => pair,
        Err(e) => return bad_gateway(e.to_string()),
    };
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "proxy: connection to the instance ended");
        }
    });
    let mut response = match sender.send_request(outgoing).await {
        Ok(response) => response,
        Err(e) => {
            return bad_gateway(format!(
                "the app closed the connection without an answer ({e})"
            ))
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let app_upgrade = hyper::upgrade::on(&mut response);
            splice(state, client_upgrade, app_upgrade);
        }
    }
    // An upgraded connection becomes the stream; any other is kept for the next request.
    let back = upgrade.is_none().then_some((key, sender));
    answer(state, hop, response, back)
}

/// The app's answer as the client gets it: no hop-by-hop headers, and on the apps' site none
/// of our cookies set; on the console's, sandboxed.
fn answer(
    state: &AppState,
    hop: &Hop<'_>,
    response: hyper::Response<hyper::body::Incoming>,
    back: Option<(
        super::pool::Key,
        hyper::client::conn::http1::SendRequest<Body>,
    )>,
) -> Response {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(
        &mut parts.headers,
        parts.status == StatusCode::SWITCHING_PROTOCOLS,
    );
    if hop.apps_site {
        drop_our_cookies(&mut parts.headers);
    } else {
        sandbox(&mut parts.headers);
    }
    match back {
        Some((key, sender)) => Response::from_parts(
            parts,
            Body::new(state.upstreams.returning(key, sender, body)),
        ),
        None => Response::from_parts(parts, Body::new(body)),
    }
}

/// The `Upgrade` a request asks for with `Connection: upgrade` (a WebSocket's).
fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// The request as the app gets it: its path as the client sent it, without the proxy's
/// credentials (the bearer token, the proxy cookie) and hop-by-hop headers, with
/// `X-Forwarded-For`, `-Proto` and `-Host`. `Host` stays the client's (apps such as Jupyter
/// compare a WebSocket's `Origin` with it).
fn outgoing(
    state: &AppState,
    request: Request,
    path: &str,
    upgrade: Option<&HeaderValue>,
) -> Result<Request, ApiError> {
    let (mut parts, body) = request.into_parts();
    let path_and_query = match parts.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    parts.uri = path_and_query
        .parse()
        .map_err(|_| ApiError::Malformed("the request's path is not a valid URI".into()))?;
    parts.version = axum::http::Version::HTTP_11;
    let headers = &mut parts.headers;
    let client = parts
        .extensions
        .get::<ConnectInfo<crate::tls::Peer>>()
        .map(|c| c.0.addr.ip().to_string());
    let host = headers.get(header::HOST).cloned();
    strip_hop_by_hop(headers, false);
    headers.remove(header::AUTHORIZATION);
    let cookies = access::cookie_without_proxy(headers);
    headers.remove(header::COOKIE);
    if let Some(v) = cookies.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::COOKIE, v);
    }
    if let Some(upgrade) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade.clone());
    }
    if let Some(client) = client {
        let forwarded = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(before) => format!("{before}, {client}"),
            None => client,
        };
        if let Ok(v) = HeaderValue::from_str(&forwarded) {
            headers.insert(HeaderName::from_static("x-forwarded-for"), v);
        }
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static(super::scheme(state)),
    );
    match host {
        Some(host) => {
            headers.insert(HeaderName::from_static("x-forwarded-host"), host);
        }
        None => {
            headers.insert(header::HOST, HeaderValue::from_static("localhost"));
        }
    }
    Ok(Request::from_parts(parts, body))
}

/// Removes hop-by-hop headers and those `Connection` names; a 101 keeps its `Connection`
/// and `Upgrade`, which make the switch.
fn strip_hop_by_hop(headers: &mut HeaderMap, switching: bool) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    for name in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        if switching && (name == "connection" || name == "upgrade") {
            continue;
        }
        headers.remove(name);
    }
}

/// On the apps' site an app sets cookies for its own host only, and never one of ours (it
/// could fix another browser session's proxy cookie, or, were the console's cookies in reach,
/// log its visitor out or into the app owner's account): a `Set-Cookie` naming one of ours, or
/// with a `Domain` (which would reach the other apps), is dropped.
fn drop_our_cookies(headers: &mut HeaderMap) {
    let kept: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|v| v.to_str().is_ok_and(is_host_only_and_theirs))
        .cloned()
        .collect();
    headers.remove(header::SET_COOKIE);
    for v in kept {
        headers.append(header::SET_COOKIE, v);
    }
}

/// Whether a `Set-Cookie` value names a cookie of the app's own, for its host only.
fn is_host_only_and_theirs(set_cookie: &str) -> bool {
    let mut parts = set_cookie.split(';');
    let name = parts
        .next()
        .and_then(|pair| pair.split_once('='))
        .map(|(name, _)| name.trim());
    let Some(name) = name else {
        return false;
    };
    !access::is_ours(name)
        && !parts.any(|attribute| {
            let key = attribute.split('=').next().unwrap_or("").trim();
            key.eq_ignore_ascii_case("domain")
        })
}

/// On the console's site (`/proxy/ID/PORT/`, for bearer-token clients) an app's answer runs
/// nothing with the console's origin: `Content-Security-Policy: sandbox` gives it an opaque
/// origin with no scripts, and it may set no cookie.
fn sandbox(headers: &mut HeaderMap) {
    headers.remove(header::SET_COOKIE);
    headers.remove(header::CONTENT_SECURITY_POLICY);
    headers.remove(HeaderName::from_static(
        "content-security-policy-report-only",
    ));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
}

/// Once both sides have switched, copies bytes between the client and the app until either
/// closes.
fn splice(state: &AppState, client: hyper::upgrade::OnUpgrade, app: hyper::upgrade::OnUpgrade) {
    let metrics = state.metrics.clone();
    metrics.proxy.upgrades.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        let (client, app) = match tokio::try_join!(client, app) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "proxy: an upgrade did not complete");
                return;
            }
        };
        metrics.proxy.websockets.fetch_add(1, Ordering::Relaxed);
        let mut client = TokioIo::new(client);
        let mut app = TokioIo::new(app);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut app).await;
        SshCounts::down(&metrics.proxy.websockets);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_sets_only_its_own_host_only_cookies() {
        for ours in [
            "gpurent_session=x; Path=/",
            "__Host-gpurent_session=x; Path=/; Secure",
            "gpurent_login=x",
            "__Secure-gpurent_lang=zh-CN",
            " gpurent_proxy = x",
            "__Host-gpurent_proxy=x; Path=/",
            "theme=dark; Path=/; Domain=localhost",
            "theme=dark; domain=.example.net; Path=/",
            "no-equals-sign",
        ] {
            assert!(!is_host_only_and_theirs(ours), "{ours}");
        }
        for theirs in [
            "_xsrf=abc; Path=/; HttpOnly",
            "theme=dark",
            "session=1; SameSite=Lax",
        ] {
            assert!(is_host_only_and_theirs(theirs), "{theirs}");
        }
    }

    #[test]
    fn the_console_site_gets_a_sandboxed_answer_without_cookies() {
        let mut h = HeaderMap::new();
        h.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
        h.append(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("script-src *"),
        );
        sandbox(&mut h);
        assert!(h.get(header::SET_COOKIE).is_none());
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], "sandbox");
    }
}
