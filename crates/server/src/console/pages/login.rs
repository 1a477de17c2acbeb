//! `/login` and `/logout`: a session from a name and password (the API's argon2id login), kept
//! in the session cookie until it expires or the user logs out.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use gpurent_types::api::{Login, Session};
use maud::html;
use serde::Deserialize;

use crate::console::api::Failure;
use crate::console::lang::cookie;
use crate::console::layout::{alert, raw, Ctx, PageError};
use crate::console::session::{
    self, cookie_value, session_cookie, CSRF_FIELD, LOGIN_COOKIE, SESSION_COOKIE,
};
use crate::state::AppState;

#[derive(Debug, Deserialize)]
pub(crate) struct NextQuery {
    next: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default, rename = "_csrf")]
    csrf: String,
    #[serde(default)]
    next: Option<String>,
}

/// Only a path of this site: never `//elsewhere` or `https://...` (an open redirect), and
/// nothing a browser would read otherwise (it drops tabs and newlines, so `/\t/host` is
/// `//host`); anything else is `/`.
fn local(next: Option<&str>) -> &str {
    match next {
        Some(n) if is_local_path(n) => n,
        _ => "/",
    }
}

/// The longest `next` kept.
const MAX_NEXT: usize = 2048;

/// A path of this site in visible ASCII: it starts with one `/`, has no backslash, and no
/// control character, raw or percent-encoded.
fn is_local_path(n: &str) -> bool {
    let visible = |b: u8| b.is_ascii_graphic() && b != b'\\';
    let decoded: Vec<u8> = percent_encoding::percent_decode(n.as_bytes()).collect();
    n.len() <= MAX_NEXT
        && n.starts_with('/')
        && !n.starts_with("//")
        && n.bytes().all(visible)
        && decoded
            .iter()
            .all(|&b| visible(b) || b == b' ' || b >= 0x80)
        && !decoded.starts_with(b"//")
}

pub(crate) async fn form(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<NextQuery>,
) -> Response {
    if session::authenticate(&state, &headers).await.is_ok() {
        return Redirect::to(local(q.next.as_deref())).into_response();
    }
    render(&ctx, "", q.next.as_deref(), None)
}

/// The form, with a fresh login CSRF token in a cookie and in the form.
fn render(ctx: &Ctx, username: &str, next: Option<&str>, failure: Option<&Failure>) -> Response {
    let l = ctx.lang;
    let token = crate::auth::new_token("gpl");
    let body = html! {
        @if let Some(f) = failure { (alert(l, f)) }
        form.card.narrow method="post" action="/login" data-form="login" {
            input type="hidden" name=(CSRF_FIELD) value=(token);
            input type="hidden" name="next" value=(local(next));
            label for="username" { (l.t("Name", "用户名")) }
            input id="username" name="username" type="text" autocomplete="username" required value=(username) autofocus;
            label for="password" { (l.t("Password", "密码")) }
            input id="password" name="password" type="password" autocomplete="current-password" required;
            button type="submit" { (l.t("Log in", "登录")) }
        }
        p.hint { (l.t("An admin sets your password with", "管理员可用以下命令设置密码：")) " " (raw("gpurent users passwd USER_ID")) }
    };
    // A wrong password is a 401; a try during the account's wait, the API's 429.
    let status = failure.map_or(StatusCode::OK, |f| f.status);
    let mut response = ctx.page_with_status(status, l.t("Log in", "登录"), body);
    response.headers_mut().append(
        header::SET_COOKIE,
        cookie_value(LOGIN_COOKIE, &token, 3600, ctx.secure),
    );
    response
}

pub(crate) async fn submit(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    // The form's token must be the one this browser was given with it: another site cannot
    // log a victim into the attacker's account.
    let login_cookie = session::cookie_name(LOGIN_COOKIE, ctx.secure);
    let expected = cookie(&headers, &login_cookie).unwrap_or("");
    if expected.is_empty() || form.csrf != expected || !session::same_origin(&headers) {
        return Err(PageError::new(
            l,
            StatusCode::FORBIDDEN,
            "csrf",
            "this login form is not the one this browser was given; reload the page and try again",
        ));
    }
    let api = ctx.api(&state)?;
    let login = Login {
        name: form.username.trim().to_owned(),
        password: form.password,
    };
    match api.post::<_, Session>("/api/v1/login", &login).await {
        Ok(s) => {
            let mut response = Redirect::to(local(form.next.as_deref())).into_response();
            let h = response.headers_mut();
            h.append(
                header::SET_COOKIE,
                session_cookie(&s.token, s.expires_at, state.now(), ctx.secure),
            );
            h.append(
                header::SET_COOKIE,
                cookie_value(LOGIN_COOKIE, "", 0, ctx.secure),
            );
            Ok(response)
        }
        Err(f)
            if matches!(
                f.status,
                StatusCode::UNAUTHORIZED | StatusCode::TOO_MANY_REQUESTS
            ) =>
        {
            Ok(render(&ctx, &login.name, form.next.as_deref(), Some(&f)))
        }
        Err(f) => Err(ctx.failed(f)),
    }
}

/// Ends the session: its token is revoked, the cookie cleared.
pub(crate) async fn logout(State(state): State<AppState>, ctx: Ctx) -> Result<Response, PageError> {
    let viewer = ctx.viewer()?;
    let api = ctx.api(&state)?;
    let path = format!("/api/v1/tokens/{}", viewer.token_id);
    if let Err(f) = api.send(axum::http::Method::DELETE, &path, None).await {
        tracing::warn!(error = %f, "logging out: the session token was not revoked");
    }
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        cookie_value(SESSION_COOKIE, "", 0, ctx.secure),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_a_local_path_or_the_home_page() {
        for good in [
            "/",
            "/instances",
            "/instances/r1?tab=log",
            "/a%20b",
            "/%C3%A9",
        ] {
            assert_eq!(local(Some(good)), good);
        }
        for bad in [
            "//evil.example",
            "/\\evil.example",
            "\\\\evil.example",
            "https://evil.example/",
            "javascript:alert(1)",
            "/\n/x",
            "/\t/evil.example",
            "/%0a/x",
            "/%09/evil.example",
            "/%5Cevil.example",
            "/%2F/evil.example",
            "/caf\u{e9}",
            "",
            "instances",
        ] {
            assert_eq!(local(Some(bad)), "/", "{bad:?}");
        }
        assert_eq!(local(None), "/");
        assert_eq!(local(Some(&format!("/{}", "a".repeat(MAX_NEXT)))), "/");
    }
}
