//! `--proxy-domain DOMAIN`: a request whose `Host` is `ID-PORT.DOMAIN` goes to the proxy with
//! its path at the app's root (for apps that cannot be told a base URL), each port at an
//! origin of its own.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// Set on a request that came in on the proxy domain: its path as the client sent it (the
/// URI was rewritten to `/proxy/ID/PORT/...` for the router).
#[derive(Debug, Clone)]
pub(crate) struct ViaHost {
    pub path: String,
}

/// (reservation id, port) of a `Host: ID-PORT.DOMAIN` (any port of the listener after it).
pub(crate) fn target(headers: &HeaderMap, domain: &str) -> Option<(String, u16)> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let domain = domain.trim_matches('.').to_ascii_lowercase();
    let label = name.strip_suffix(&domain)?.strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (id, port) = label.rsplit_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    (!id.is_empty()).then(|| (id.to_owned(), port))
}

/// Runs before routing: a request on the proxy domain is routed as `/proxy/ID/PORT/PATH`.
pub(crate) async fn route(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(domain) = state.config.proxy_domain.as_deref() else {
        return next.run(request).await;
    };
    let Some((id, port)) = target(request.headers(), domain) else {
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
    }
}
