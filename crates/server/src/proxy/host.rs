//! The apps' site (`--apps-domain`, `localhost` by default): a request whose `Host` is
//! `ID-PORT.DOMAIN` goes to the proxy with its path at the app's root (`NAME.e.DOMAIN`, to the
//! endpoint `NAME`), each port at an origin
//! of its own that shares no cookie with the console's; the console itself is never served on
//! that site.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// The apps' site when none is configured: browsers resolve every `*.localhost` to the
/// loopback, and `ID-PORT.localhost` shares no cookie with `127.0.0.1`, where the console is.
pub const DEFAULT_APPS_DOMAIN: &str = "localhost";

/// What the control plane still answers on a host of the apps' site that names no app: the
/// API and the health checks (bearer tokens, no cookies), never the console.
const SERVED_ON_APPS_SITE: [&str; 5] = ["/api/", "/proxy/", "/healthz", "/readyz", "/metrics"];

/// Set on a request that came in on the apps' site: its path as the client sent it (the
/// URI was rewritten to `/proxy/ID/PORT/...` for the router).
#[derive(Debug, Clone)]
pub(crate) struct ViaHost {
    pub path: String,
}

/// The request's host name, lowercased, without its port and trailing dot.
fn host_name(headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    Some(name.trim_end_matches('.').to_ascii_lowercase())
}

/// The label of `name` under `domain` (`ID-PORT` of `ID-PORT.DOMAIN`), if it is one level
/// below it.
fn label_under<'a>(name: &'a str, domain: &str) -> Option<&'a str> {
    let domain = domain.trim_matches('.');
    let label = name.strip_suffix(domain)?.strip_suffix('.')?;
    (!label.is_empty()).then_some(label)
}

/// (reservation id, port) of a `Host: ID-PORT.DOMAIN` (any port of the listener after it).
pub(crate) fn target(headers: &HeaderMap, domain: &str) -> Option<(String, u16)> {
    let name = host_name(headers)?;
    let label = label_under(&name, &domain.to_ascii_lowercase())?;
    if label.contains('.') {
        return None;
    }
    let (id, port) = label.rsplit_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    (!id.is_empty()).then(|| (id.to_owned(), port))
}

/// The endpoint of a `Host: NAME.e.DOMAIN` (any port of the listener after it).
pub(crate) fn endpoint(headers: &HeaderMap, domain: &str) -> Option<String> {
    let name = host_name(headers)?;
    let label = label_under(&name, &domain.to_ascii_lowercase())?;
    let endpoint = label.strip_suffix(".e")?;
    (!endpoint.is_empty() && !endpoint.contains('.')).then(|| endpoint.to_owned())
}

/// Whether the request's host is on the apps' site: the domain itself or any name under it.
pub(crate) fn on_apps_site(headers: &HeaderMap, domain: &str) -> bool {
    let domain = domain.trim_matches('.').to_ascii_lowercase();
    host_name(headers).is_some_and(|name| name == domain || label_under(&name, &domain).is_some())
}

/// Runs before routing: a request for an app is routed as `/proxy/ID/PORT/PATH`; a console
/// page asked for on the apps' site is sent to the console's site (`localhost` to
/// `127.0.0.1`) or not found, so that no console cookie is ever set where apps could reach it.
pub(crate) async fn route(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let domain = state.config.apps_domain.as_str();
    if let Some(name) = endpoint(request.headers(), domain) {
        let path = request.uri().path().to_owned();
        let rewritten = match request.uri().query() {
            Some(q) => format!("{}{name}{path}?{q}", crate::endpoints::serve::PREFIX),
            None => format!("{}{name}{path}", crate::endpoints::serve::PREFIX),
        };
        match rewritten.parse::<Uri>() {
            Ok(uri) => *request.uri_mut() = uri,
            Err(_) => return crate::error::ApiError::NoRoute(path).into_response(),
        }
        request.extensions_mut().insert(ViaHost { path });
        return next.run(request).await;
    }
    let Some((id, port)) = target(request.headers(), domain) else {
        let path = request.uri().path();
        if on_apps_site(request.headers(), domain)
            && !SERVED_ON_APPS_SITE.iter().any(|p| path.starts_with(p))
        {
            return off_the_apps_site(&state, &request);
        }
        return next.run(request).await;
    };
    let path = request.uri().path().to_owned();
    let rewritten = match request.uri().query() {
        Some(q) => format!("{}{id}/{port}{path}?{q}", super::PREFIX),
        None => format!("{}{id}/{port}{path}", super::PREFIX),
    };
    match rewritten.parse::<Uri>() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => return crate::error::ApiError::NoRoute(path).into_response(),
    }
    request.extensions_mut().insert(ViaHost { path });
    next.run(request).await
}

/// A console page asked for on the apps' site: on the default `localhost`, the same page at
/// `127.0.0.1` (the console's own site); on a configured domain, not found.
fn off_the_apps_site(state: &AppState, request: &Request) -> Response {
    let path = request.uri().path().to_owned();
    let loopback = host_name(request.headers()).as_deref() == Some(DEFAULT_APPS_DOMAIN);
    if !loopback {
        return crate::error::ApiError::NoRoute(path).into_response();
    }
    let port = super::request_host(request.headers())
        .map(super::listener_port)
        .unwrap_or_default();
    let to = format!(
        "{}://127.0.0.1{port}{}",
        super::scheme(state),
        request.uri().path_and_query().map_or("/", |p| p.as_str())
    );
    let mut response = StatusCode::PERMANENT_REDIRECT.into_response();
    if let Ok(v) = axum::http::HeaderValue::from_str(&to) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(h: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(header::HOST, h.parse().unwrap());
        m
    }

    #[test]
    fn the_reservation_and_port_are_in_the_first_label() {
        let d = "apps.example.com";
        let id = "0f8e2c1a-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(
            target(&host(&format!("{id}-8888.apps.example.com")), d),
            Some((id.to_owned(), 8888))
        );
        assert_eq!(
            target(&host(&format!("{id}-8888.Apps.Example.com:8443")), d),
            Some((id.to_owned(), 8888))
        );
        assert_eq!(target(&host("apps.example.com"), d), None);
        assert_eq!(target(&host("x.y-1.apps.example.com"), d), None);
        assert_eq!(target(&host("r-0.apps.example.com"), d), None);
        assert_eq!(target(&host("r-1.otherapps.example.com"), d), None);
        assert_eq!(target(&host("r-1.apps.example.com.evil.net"), d), None);
        assert_eq!(
            target(&host("r1-8888.localhost:8080"), DEFAULT_APPS_DOMAIN),
            Some(("r1".to_owned(), 8888))
        );
    }

    #[test]
    fn an_endpoint_is_the_label_before_e() {
        let d = "apps.example.com";
        let e = |h: &str| endpoint(&host(h), d);
        assert_eq!(e("llm.e.apps.example.com"), Some("llm".to_owned()));
        assert_eq!(e("LLM.E.Apps.Example.com:8443"), Some("llm".to_owned()));
        assert_eq!(e("e.apps.example.com"), None);
        assert_eq!(e(".e.apps.example.com"), None);
        assert_eq!(e("a.b.e.apps.example.com"), None);
        assert_eq!(e("llm.f.apps.example.com"), None);
        assert_eq!(e("llm.e.other.example.com"), None);
        assert_eq!(
            endpoint(&host("llm.e.localhost:8080"), DEFAULT_APPS_DOMAIN),
            Some("llm".to_owned())
        );
        assert_eq!(target(&host("llm.e.localhost"), DEFAULT_APPS_DOMAIN), None);
    }

    #[test]
    fn the_apps_site_is_the_domain_and_everything_under_it() {
        let d = "apps.example.com";
        assert!(on_apps_site(&host("apps.example.com"), d));
        assert!(on_apps_site(&host("x.y.Apps.Example.com.:443"), d));
        assert!(!on_apps_site(&host("console.example.com"), d));
        assert!(!on_apps_site(&host("evilapps.example.com"), d));
        assert!(on_apps_site(&host("localhost:8080"), DEFAULT_APPS_DOMAIN));
        assert!(!on_apps_site(&host("127.0.0.1:8080"), DEFAULT_APPS_DOMAIN));
    }
}
