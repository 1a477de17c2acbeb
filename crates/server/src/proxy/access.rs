//! Who may reach a published port: the reservation's owner (or a member of its team who may
//! enter it), by bearer token, or on the apps' site by the proxy cookie a one-time ticket set
//! there; and turning that ticket into the cookie.

use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::Response;
use gpurent_store::ProxyTokenKind;
use gpurent_types::api::Reservation;

use super::host::ViaHost;
use super::{Target, LINK_PARAM};
use crate::auth::{hash_token, new_token};
use crate::state::AppState;

/// The cookie holding a proxy session token (with the `__Host-` prefix under TLS, so that no
/// other app can set it for this one).
pub(super) const COOKIE: &str = "gpurent_proxy";

/// Which site a request for an app came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Site {
    /// `ID-PORT.APPS-DOMAIN`: the app's own origin.
    Apps,
    /// `/proxy/ID/PORT/` on the console's origin: bearer tokens only.
    Console,
}

/// The proxy cookie's name on this server.
pub(super) fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-gpurent_proxy"
    } else {
        COOKIE
    }
}

/// A cookie's name without a `__Host-` or `__Secure-` prefix: what it is to the console.
pub(crate) fn unprefixed(name: &str) -> &str {
    name.strip_prefix("__Host-")
        .or_else(|| name.strip_prefix("__Secure-"))
        .unwrap_or(name)
}

/// Whether a cookie name is one of the control plane's own (the proxy's or the console's,
/// prefixed or not): an app never sees, sets or clears one.
pub(super) fn is_ours(name: &str) -> bool {
    let name = unprefixed(name.trim());
    name == COOKIE || crate::console::session::COOKIES.contains(&name)
}
/// How long a browser session a link opened lasts.
pub(super) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// The value of `?gpurent_link=` if the request carries one.
pub(super) fn link_param(uri: &Uri) -> Option<String> {
    uri.query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix(LINK_PARAM)?.strip_prefix('='))
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The query without `gpurent_link`.
fn query_without_link(uri: &Uri) -> String {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some(LINK_PARAM))
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether the request's bearer token is the owner's (with the `ssh` scope, where it has
/// scopes), or (on the apps' site only) one of its
/// proxy cookies opens this port of this reservation. No console session ever opens an app:
/// the console's cookies never reach the apps' site, and on the console's site a browser's
/// ambient credential must not be enough to load a tenant's page there.
pub(super) async fn allowed(
    state: &AppState,
    target: &Target,
    reservation: &Reservation,
    headers: &HeaderMap,
    site: Site,
) -> bool {
    if headers.contains_key(header::AUTHORIZATION) {
        if let Ok(caller) = crate::auth::authenticate(state, headers).await {
            // A token that may enter instances (`ssh` among its scopes), bound to no team or
            // to the reservation's: its owner's, or a member's of its team whose role may
            // enter it.
            let bound_here =
                caller.1.team_id.as_ref().is_none_or(|team| {
                    *team == reservation.tenant_id && reservation.team.is_some()
                });
            if bound_here
                && caller.1.allows(gpurent_types::TokenScope::Ssh)
                && crate::teams::may_open_apps(state, &caller.0.id, reservation).await
            {
                return true;
            }
        }
    }
    if site == Site::Console || from_another_app(headers) {
        return false;
    }
    let now = state.now();
    let name = cookie_name(state.config.tls.is_some());
    for token in cookie_values(headers, name) {
        if let Ok(Some(grant)) = state.store.proxy_session(&hash_token(token), now).await {
            if grant.reservation_id == target.reservation_id
                && grant.port == target.port
                && crate::teams::may_open_apps(state, &grant.user_id, reservation).await
            {
                return true;
            }
        }
    }
    false
}

/// Whether a browser says the request comes from another origin of the same site: under a
/// configured apps' domain every app is one site, so another tenant's app on it would send
/// this app's `SameSite=Lax` cookie with its requests. Such a request gets no cookie's access
/// (a bearer token still works); a navigation from the console or a link elsewhere is
/// `cross-site`, the app's own requests `same-origin`.
fn from_another_app(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"same-site"))
}

/// Every value of the cookie `name` the request sends (a browser sends one per path that
/// matches).
pub(crate) fn cookie_values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then_some(v)
        })
        .collect()
}

/// The `Cookie` header without the proxy's and the console's cookies, prefixed or not (the
/// app never sees them); None when nothing else is left.
pub(super) fn cookie_without_proxy(headers: &HeaderMap) -> Option<String> {
    let kept: Vec<&str> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or("");
            !pair.is_empty() && !is_ours(name)
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("; "))
}

/// Uses a one-time ticket on the apps' site (`open.rs` makes one for the owner's console
/// session): on success the browser gets a session cookie for this app's whole host and is
/// sent on (303) to the same path without the ticket; None (a 404) when the ticket is not valid
/// for this port of this reservation, or was used already.
pub(super) async fn redeem(
    state: &AppState,
    target: &Target,
    reservation: &Reservation,
    uri: &Uri,
    via: &ViaHost,
    ticket: &str,
) -> Option<Response> {
    let now = state.now();
    let grant = state
        .store
        .redeem_proxy_token(
            ProxyTokenKind::Ticket,
            &hash_token(ticket),
            &target.reservation_id,
            target.port,
            now,
        )
        .await
        .ok()??;
    if !crate::teams::may_open_apps(state, &grant.user_id, reservation).await {
        return None;
    }
    let session = new_token("gps");
    let expires = now + chrono::Duration::from_std(SESSION_TTL).ok()?;
    if let Err(e) = state
        .store
        .add_proxy_token(
            ProxyTokenKind::Session,
            &hash_token(&session),
            &grant,
            expires,
            now,
        )
        .await
    {
        tracing::warn!(error = %e, "proxy: cannot keep a session");
        return None;
    }
    let secure = state.config.tls.is_some();
    let cookie = format!(
        "{}={session}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax{}",
        cookie_name(secure),
        SESSION_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    let query = query_without_link(uri);
    // The path the browser sees is the app's own (the rewrite to /proxy/ is ours); one that
    // starts `//` would name another host in a Location.
    let path = if via.path.starts_with("//") {
        "/"
    } else {
        via.path.as_str()
    };
    let to = if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    };
    Some(super::redirect(StatusCode::SEE_OTHER, &to, Some(cookie)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_is_read_and_dropped_from_the_query() {
        let uri: Uri = "/proxy/r/1/lab?a=1&gpurent_link=gpl_x&b=2".parse().unwrap();
        assert_eq!(link_param(&uri).as_deref(), Some("gpl_x"));
        assert_eq!(query_without_link(&uri), "a=1&b=2");
        let uri: Uri = "/proxy/r/1/?gpurent_linked=1".parse().unwrap();
        assert_eq!(link_param(&uri), None);
    }

    #[test]
    fn the_proxy_cookie_is_kept_from_the_app() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, "_xsrf=1; gpurent_proxy=s1".parse().unwrap());
        h.append(header::COOKIE, "gpurent_proxy=s2".parse().unwrap());
        assert_eq!(cookie_values(&h, COOKIE), vec!["s1", "s2"]);
        assert_eq!(cookie_without_proxy(&h).as_deref(), Some("_xsrf=1"));
        let mut only = HeaderMap::new();
        only.append(
            header::COOKIE,
            "gpurent_proxy=s1; __Host-gpurent_session=x; __Secure-gpurent_lang=en"
                .parse()
                .unwrap(),
        );
        assert_eq!(cookie_without_proxy(&only), None);
    }
}
