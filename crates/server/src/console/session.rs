//! Console sessions: a login session token in an HttpOnly, SameSite=Strict cookie that expires
//! with it, and the CSRF token (derived from it) that every form and state-changing request of
//! the console must carry.

use axum::body::Body;
use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method};
use chrono::{DateTime, Utc};
use gpurent_store::{AuthUser, TokenCheck};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

use super::lang::cookie;
use crate::auth::hash_token;
use crate::state::AppState;

pub(crate) const SESSION_COOKIE: &str = "gpurent_session";
/// Before a session exists: the login form's own CSRF token, as a cookie and a field.
pub(crate) const LOGIN_COOKIE: &str = "gpurent_login";
pub(crate) const CSRF_FIELD: &str = "_csrf";
/// Every cookie the console sets; none of them is passed on to an instance's app. Under TLS
/// each has the `__Host-` prefix ([`cookie_name`]): a browser takes such a cookie only from
/// this host itself, over HTTPS, for `Path=/`, so no other site can set or overwrite it.
pub(crate) const COOKIES: &[&str] = &[SESSION_COOKIE, LOGIN_COOKIE, super::lang::LANG_COOKIE];

/// A console cookie's name as it is set and read: with the `__Host-` prefix under TLS.
pub(crate) fn cookie_name(name: &str, secure: bool) -> std::borrow::Cow<'_, str> {
    if secure {
        std::borrow::Cow::Owned(format!("__Host-{name}"))
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";
/// The most a console form may post (the reserve form with its env and secrets is a few KiB).
const MAX_FORM_BYTES: usize = 256 * 1024;

/// The logged-in user of a console request, with the session token its pages call the API
/// with.
#[derive(Clone)]
pub(crate) struct Viewer {
    pub user: AuthUser,
    pub token: String,
    pub token_id: String,
    /// When the session's token expires.
    pub expires_at: Option<DateTime<Utc>>,
    /// When the login that made the session happened (`None`: an API token as the cookie).
    pub login_at: Option<DateTime<Utc>>,
    pub csrf: String,
}

impl std::fmt::Debug for Viewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Viewer")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Why a console request has no viewer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoSession {
    #[error("not logged in")]
    Missing,
    #[error("the session has ended; log in again")]
    Ended,
    #[error(transparent)]
    Store(#[from] gpurent_store::StoreError),
}

/// The CSRF token of a session: a keyed digest of its token, so that it needs no storage and
/// tells nothing about the token.
pub(crate) fn csrf_for(token: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"gpurent console csrf\0");
    hash.update(token.as_bytes());
    hex::encode(&hash.finalize()[..16])
}

pub(crate) async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Viewer, NoSession> {
    let name = cookie_name(SESSION_COOKIE, state.config.tls.is_some());
    let token = cookie(headers, &name)
        .filter(|t| !t.is_empty())
        .ok_or(NoSession::Missing)?;
    match state
        .store
        .check_token(&hash_token(token), state.now())
        .await?
    {
        TokenCheck::Valid(user, facts) => Ok(Viewer {
            user,
            token: token.to_owned(),
            token_id: facts.id,
            expires_at: facts.expires_at,
            login_at: facts.login_at,
            csrf: csrf_for(token),
        }),
        TokenCheck::Expired(_) | TokenCheck::Revoked(_) | TokenCheck::Unknown => {
            Err(NoSession::Ended)
        }
    }
}

/// The `Set-Cookie` of a new session, expiring with its token.
pub(crate) fn session_cookie(
    token: &str,
    expires_at: DateTime<Utc>,
    now: DateTime<Utc>,
    secure: bool,
) -> HeaderValue {
    let max_age = (expires_at - now).num_seconds().max(0);
    cookie_value(SESSION_COOKIE, token, max_age, secure)
}

/// A cookie the console sets: never readable by scripts, never sent by another site.
pub(crate) fn cookie_value(name: &str, value: &str, max_age: i64, secure: bool) -> HeaderValue {
    let name = cookie_name(name, secure);
    let secure = if secure { "; Secure" } else { "" };
    let text =
        format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Whether a request changes something, so must carry its CSRF token.
pub(crate) fn is_unsafe(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A request from another site (its `Origin` is not this host) is refused whatever it
/// carries; browsers send `Origin` on every POST and WebSocket.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h))
}

/// Checks a state-changing request's CSRF token against `expected`: the `X-CSRF-Token`
/// header, or the form's `_csrf` field (the body is read and put back). The form's fields
/// come back with it so a handler can use them.
pub(crate) async fn check_csrf(request: Request, expected: &str) -> Result<Request, CsrfError> {
    if !same_origin(request.headers()) {
        return Err(CsrfError::CrossOrigin);
    }
    if let Some(given) = request.headers().get(CSRF_HEADER) {
        return if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
            Ok(request)
        } else {
            Err(CsrfError::Wrong)
        };
    }
    let (parts, body) = request.into_parts();
    let bytes = http_body_util::Limited::new(body, MAX_FORM_BYTES)
        .collect()
        .await
        .map_err(|_| CsrfError::TooLarge)?
        .to_bytes();
    let given = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&bytes)
        .ok()
        .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == CSRF_FIELD))
        .map(|(_, v)| v)
        .ok_or(CsrfError::Missing)?;
    if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        return Err(CsrfError::Wrong);
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// A console form whose every name and value is UTF-8 once decoded, as the API's JSON must
/// be: `axum::Form` would turn invalid bytes into U+FFFD and pass them on.
pub(crate) struct StrictForm<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S>
    for StrictForm<T>
{
    type Rejection = super::layout::PageError;

    async fn from_request(request: Request, _: &S) -> Result<Self, Self::Rejection> {
        let lang = super::lang::Lang::of(request.uri().query(), request.headers());
        let refuse = |message: String| {
            super::layout::PageError::new(
                lang,
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_value",
                message,
            )
        };
        let bytes = http_body_util::Limited::new(request.into_body(), MAX_FORM_BYTES)
            .collect()
            .await
            .map_err(|_| refuse("this form is too large".into()))?
            .to_bytes();
        if let Some(field) = not_utf8(&bytes) {
            return Err(refuse(format!("{field}: not valid UTF-8")));
        }
        serde_urlencoded::from_bytes(&bytes)
            .map(StrictForm)
            .map_err(|e| refuse(format!("this form cannot be read: {e}")))
    }
}

/// The name of the first field of a urlencoded form whose name or value is not UTF-8 once
/// decoded (`+` a space, `%XX` a byte).
fn not_utf8(body: &[u8]) -> Option<String> {
    let decode = |part: &[u8]| -> Vec<u8> {
        let spaced: Vec<u8> = part
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect();
        percent_encoding::percent_decode(&spaced).collect()
    };
    body.split(|&b| b == b'&').find_map(|pair| {
        let mut halves = pair.splitn(2, |&b| b == b'=');
        let name = decode(halves.next().unwrap_or_default());
        let value = decode(halves.next().unwrap_or_default());
        let bad = std::str::from_utf8(&name).is_err() || std::str::from_utf8(&value).is_err();
        bad.then(|| String::from_utf8_lossy(&name).into_owned())
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CsrfError {
    #[error("this form came from another site")]
    CrossOrigin,
    #[error("this form has no CSRF token; reload the page and try again")]
    Missing,
    #[error("this form's CSRF token is not this session's; reload the page and try again")]
    Wrong,
    #[error("this form is too large")]
    TooLarge,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// In a console handler: the viewer `policy::authorize` found.
impl FromRequestParts<AppState> for Viewer {
    type Rejection = super::layout::PageError;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Viewer>()
            .cloned()
            .ok_or_else(|| super::layout::PageError::internal("a console page without a session"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_tls_the_cookies_are_host_prefixed() {
        let tls = cookie_value(SESSION_COOKIE, "t", 60, true);
        let tls = tls.to_str().unwrap();
        assert!(
            tls.starts_with("__Host-gpurent_session=t; Path=/;"),
            "{tls}"
        );
        assert!(
            tls.ends_with("; Secure") && !tls.contains("Domain"),
            "{tls}"
        );
        let plain = cookie_value(SESSION_COOKIE, "t", 60, false);
        assert!(plain.to_str().unwrap().starts_with("gpurent_session=t;"));
        assert_eq!(cookie_name(LOGIN_COOKIE, true), "__Host-gpurent_login");
    }

    #[test]
    fn csrf_tokens_differ_by_session_and_do_not_show_it() {
        let a = csrf_for("gpr_aaaa");
        assert_eq!(a, csrf_for("gpr_aaaa"));
        assert_ne!(a, csrf_for("gpr_aaab"));
        assert!(!a.contains("aaaa"));
        assert_eq!(a.len(), 32);
    }

    #[test]
    fn origin_must_be_this_host() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
    }

    #[test]
    fn a_form_that_is_not_utf8_is_named() {
        assert_eq!(not_utf8(b"a=1&command=python+%C3%A9&b=%41"), None);
        assert_eq!(
            not_utf8(b"a=1&command=python+%FF").as_deref(),
            Some("command")
        );
        assert_eq!(not_utf8(b"a=1&command=\xff").as_deref(), Some("command"));
        assert_eq!(not_utf8(b"%C3=1").as_deref(), Some("\u{fffd}"));
        assert_eq!(not_utf8(b"a=%"), None);
    }

    #[tokio::test]
    async fn a_form_needs_its_token() {
        let form = |body: &'static str| {
            Request::builder()
                .method(Method::POST)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .unwrap()
        };
        assert_eq!(
            check_csrf(form("a=1"), "t").await.unwrap_err(),
            CsrfError::Missing
        );
        assert_eq!(
            check_csrf(form("a=1&_csrf=u"), "t").await.unwrap_err(),
            CsrfError::Wrong
        );
        let ok = check_csrf(form("a=1&_csrf=t"), "t").await.unwrap();
        let body = ok.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"a=1&_csrf=t");
    }
}
