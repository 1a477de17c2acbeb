//! The console's way to the JSON API: in-process requests with the viewer's session token, so
//! that its pages are decided by the same policy table, handlers and audit trail as the CLI.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use gpurent_types::api::ErrorBody;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tower::ServiceExt;

use super::session::Viewer;
use crate::state::AppState;

/// Marks a request the console made on behalf of a page: already counted against its
/// address's rate when the page was asked for, not audited as a read of its own, and made
/// by the viewer `console::guard` found (so `policy::authorize` does not look its token up
/// again).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Internal;

/// What an API call answered other than success: its status and the API's error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Failure {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
}

impl Failure {
    fn from_response(status: StatusCode, body: &[u8]) -> Failure {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(e) => Failure {
                status,
                code: e.error.code,
                message: e.error.message,
            },
            Err(_) => Failure {
                status,
                code: "internal".into(),
                message: String::from_utf8_lossy(body).chars().take(500).collect(),
            },
        }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Failure {
        Failure {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal".into(),
            message: message.into(),
        }
    }
}

/// The API as one viewer calls it.
#[derive(Clone)]
pub(crate) struct Api {
    router: Router,
    token: Option<String>,
    caller: Option<crate::auth::Caller>,
    peer: Option<ConnectInfo<crate::tls::Peer>>,
    /// The `Host` the page was asked at, for answers that say where something is reached.
    host: Option<HeaderValue>,
}

impl Api {
    /// The API for a page's viewer (no token: only public routes, like the login).
    pub(crate) fn new(
        state: &AppState,
        viewer: Option<&Viewer>,
        peer: Option<ConnectInfo<crate::tls::Peer>>,
    ) -> Result<Api, Failure> {
        let router = state
            .console_api
            .get()
            .cloned()
            .ok_or_else(|| Failure::internal("the console's API is not set up"))?;
        Ok(Api {
            router,
            token: viewer.map(|v| v.token.clone()),
            caller: viewer.map(|v| {
                crate::auth::Caller(
                    v.user.clone(),
                    gpurent_store::TokenFacts {
                        id: v.token_id.clone(),
                        expires_at: v.expires_at,
                        login_at: v.login_at,
                        // A console session: the user's own, unscoped.
                        scopes: None,
                        team_id: None,
                    },
                )
            }),
            peer,
            host: None,
        })
    }

    /// Its requests carry the page's `Host` (from `headers`), so that the URLs the API answers
    /// with (an endpoint's) are at the host the viewer reached the console at.
    pub(crate) fn at_host_of(mut self, headers: &HeaderMap) -> Api {
        self.host = headers.get(header::HOST).cloned();
        self
    }

    /// One request; its answer's headers and body on a 2xx.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(HeaderMap, Bytes), Failure> {
        self.send_keyed(method, path, body, None).await
    }

    /// With an `Idempotency-Key`: a form posted twice (a double click, a reload) does it once.
    pub(crate) async fn send_keyed(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        idempotency_key: Option<&str>,
    ) -> Result<(HeaderMap, Bytes), Failure> {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(key) = idempotency_key {
            request = request.header("idempotency-key", key);
        }
        if let Some(host) = &self.host {
            request = request.header(header::HOST, host.clone());
        }
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let mut request = request
            .body(body.map_or_else(Body::empty, Body::from))
            .map_err(|e| Failure::internal(format!("a console request: {e}")))?;
        request.extensions_mut().insert(Internal);
        if let Some(caller) = &self.caller {
            request.extensions_mut().insert(caller.clone());
        }
        if let Some(peer) = &self.peer {
            request.extensions_mut().insert(peer.clone());
        }
        let response = match self.router.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let (parts, body) = response.into_parts();
        let bytes = body
            .collect()
            .await
            .map_err(|e| Failure::internal(format!("reading an API answer: {e}")))?
            .to_bytes();
        if parts.status.is_success() {
            Ok((parts.headers, bytes))
        } else {
            Err(Failure::from_response(parts.status, &bytes))
        }
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Failure> {
        let (_, body) = self.send(Method::GET, path, None).await?;
        decode(&body)
    }

    /// A page of a list and the cursor of the next one (`X-Next-After`).
    pub(crate) async fn page<T: DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<(Vec<T>, Option<String>), Failure> {
        let (headers, body) = self.send(Method::GET, path, None).await?;
        let next = headers
            .get("x-next-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok((decode(&body)?, next))
    }

    pub(crate) async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, Failure> {
        self.call(Method::POST, path, body).await
    }

    pub(crate) async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> Result<T, Failure> {
        self.call_keyed(method, path, body, None).await
    }

    pub(crate) async fn call_keyed<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
        idempotency_key: Option<&str>,
    ) -> Result<T, Failure> {
        let json = serde_json::to_vec(body)
            .map_err(|e| Failure::internal(format!("a console request body: {e}")))?;
        let (_, body) = self
            .send_keyed(method, path, Some(json), idempotency_key)
            .await?;
        if body.is_empty() {
            return decode(b"null");
        }
        decode(&body)
    }
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, Failure> {
    serde_json::from_slice(body).map_err(|e| Failure::internal(format!("an API answer: {e}")))
}

/// A path segment or query value, percent-encoded.
pub(crate) fn enc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
