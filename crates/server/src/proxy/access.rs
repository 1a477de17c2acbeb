//! Who may reach a published port: the reservation's owner, by bearer token or by the proxy
//! cookie a one-time link set; and turning a one-time link into that cookie.

use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::Response;
use gpurent_store::ProxyTokenKind;
use gpurent_types::api::Reservation;

use super::{Target, LINK_PARAM};
use crate::auth::{hash_token, new_token};
use crate::state::AppState;

/// The cookie holding a proxy session token.
pub(super) const COOKIE: &str = "gpurent_proxy";
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

/// Whether the request's bearer token is the owner's, or one of its proxy cookies opens this
/// port of this reservation.
pub(super) async fn allowed(
    state: &AppState,
    target: &Target,
    reservation: &Reservation,
    headers: &HeaderMap,
) -> bool {
    if headers.contains_key(header::AUTHORIZATION) {
        if let Ok(caller) = crate::auth::authenticate(state, headers).await {
            if caller.0.id == reservation.tenant_id {
                return true;
            }
        }
    }
    // The owner's console session (a link on its instance page).
    if let Ok(viewer) = crate::console::session::authenticate(state, headers).await {
        if viewer.user.id == reservation.tenant_id {
            return true;
        }
    }
    let now = state.now();
    for token in cookie_values(headers, COOKIE) {
        if let Ok(Some(grant)) = state.store.proxy_session(&hash_token(token), now).await {
            if grant.reservation_id == target.reservation_id
                && grant.port == target.port
                && grant.user_id == reservation.tenant_id
            {
                return true;
            }
        }
    }
    false
}

/// Every value of the cookie `name` the request sends (a browser sends one per path that
/// matches).
pub(crate) fn cookie_values<'a>(headers: &'a HeaderMap, name: &'a str) -> Vec<&'a str> {
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

/// The `Cookie` header without the proxy's and the console's cookies (the app never sees
/// them); None when nothing else is left.
pub(super) fn cookie_without_proxy(headers: &HeaderMap) -> Option<String> {
    let kept: Vec<&str> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or("");
            !pair.is_empty() && name != COOKIE && !crate::console::session::COOKIES.contains(&name)
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("; "))
}

/// Uses a one-time link: on success the browser gets a session cookie for this port and is
/// sent on (303) to the same URL without the link; None (a 404) when the link is not valid
/// for this port of this reservation, or was used already.
pub(super) async fn redeem(
    state: &AppState,
    target: &Target,
    reservation: &Reservation,
    uri: &Uri,
    via_host: Option<&super::host::ViaHost>,
    link: &str,
    cookie_path: &str,
) -> Option<Response> {
    let now = state.now();
    let grant = state
        .store
        .redeem_proxy_link(&hash_token(link), &target.reservation_id, target.port, now)
        .await
        .ok()??;
    if grant.user_id != reservation.tenant_id {
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
    let secure = if state.config.tls.is_some() {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{COOKIE}={session}; Path={cookie_path}; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
        SESSION_TTL.as_secs()
    );
    let query = query_without_link(uri);
    // On the proxy domain the path the browser sees is the app's own (the rewrite is ours).
    let path = match via_host {
        Some(via) => via.path.as_str(),
        None => uri.path(),
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
        only.append(header::COOKIE, "gpurent_proxy=s1".parse().unwrap());
        assert_eq!(cookie_without_proxy(&only), None);
    }
}
