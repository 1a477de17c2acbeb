//! From the console's site to an app on the apps' site: `/open/LINK` (what `gpurent open`
//! prints) and the instance page's `/instances/ID/ports/PORT`. Only the owner's console session
//! gets through, with a one-time ticket for the app's host; anyone else's browser is told whose
//! app it is, and nothing is done.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use gpurent_store::{ProxyGrant, ProxyTokenKind, Scope};
use gpurent_types::ReservationStatus;
use maud::html;

use super::{app_url, request_host, LINK_PARAM};
use crate::auth::{hash_token, new_token};
use crate::console::api::enc;
use crate::console::layout::{Ctx, PageError};
use crate::state::AppState;

/// Where a one-time link is opened, on the console's site.
pub const PREFIX: &str = "/open/";

/// How long a ticket may take from the console's redirect to the apps' site: one redirect.
const TICKET_TTL: Duration = Duration::from_secs(60);

/// `GET /open/LINK`: the owner's session uses the link and goes on to the app; another user's
/// session gets a page that says whose app it is, and the link stays unused for its owner.
/// (Without a session, the console's guard sends the browser to log in first.)
pub(crate) async fn link(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: HeaderMap,
    Path(link): Path<String>,
) -> Result<Response, PageError> {
    let viewer = ctx.viewer()?;
    let l = ctx.lang;
    let now = state.now();
    let hash = hash_token(&link);
    let grant = state
        .store
        .peek_proxy_token(ProxyTokenKind::Link, &hash, now)
        .await
        .map_err(|e| PageError::internal(&e.to_string()))?;
    let Some(grant) = grant else {
        return Ok(ctx.page_with_status(
            StatusCode::NOT_FOUND,
            l.t("This link does not open anything", "此链接无法打开任何内容"),
            html! {
                p { (l.t(
                    "The link was used already, it expired (a link lasts 5 minutes), or it never existed. The owner of an instance makes a new one with gpurent open ID PORT, or opens the port from the instance's page.",
                    "此链接已被使用、已过期（链接有效期为 5 分钟）或从未存在。实例的所有者可以用 gpurent open ID PORT 生成新链接，或从实例页面打开该端口。"
                )) }
            },
        ));
    };
    if grant.user_id != viewer.user.id {
        let owner = state
            .store
            .get_user(&grant.user_id)
            .await
            .map(|u| u.name)
            .unwrap_or_else(|_| grant.user_id.clone());
        tracing::warn!(
            reservation = %grant.reservation_id,
            port = grant.port,
            owner = %grant.user_id,
            viewer = %viewer.user.id,
            "proxy: a link was opened by someone other than its owner; nothing done"
        );
        return Ok(ctx.page_with_status(
            StatusCode::FORBIDDEN,
            l.t("This is someone else's app", "这是别人的应用"),
            html! {
                p { (l.t("This link opens port", "此链接打开实例")) " " code { (grant.reservation_id) } " "
                    (l.t("of instance", "的端口")) " " strong { (grant.port) } ", "
                    (l.t("which belongs to", "该实例属于")) " " strong data-field="owner" { (owner) } "." }
                p { (l.t("You are logged in as", "你当前登录为")) " " strong data-field="viewer" { (viewer.user.name) } ". "
                    (l.t(
                        "Nothing was done: only an instance's owner can open its apps through the console. If you were sent this link, whoever sent it wanted you to open their app as you.",
                        "未执行任何操作：只有实例的所有者才能通过控制台打开它的应用。如果这个链接是别人发给你的，对方是想让你以你的身份打开他们的应用。"
                    )) }
            },
        ));
    }
    let used = state
        .store
        .redeem_proxy_token(
            ProxyTokenKind::Link,
            &hash,
            &grant.reservation_id,
            grant.port,
            now,
        )
        .await
        .map_err(|e| PageError::internal(&e.to_string()))?;
    match used {
        Some(grant) => to_app(&state, &ctx, &headers, grant).await,
        // Used in between, by another tab or replica.
        None => Err(PageError::new(
            l,
            StatusCode::NOT_FOUND,
            "not_found",
            l.t("The link was used already.", "此链接已被使用。"),
        )),
    }
}

/// `GET /instances/ID/ports/PORT`: the instance page's link to a published port, for its
/// owner, or a member of its team who may enter it (anyone else: not found).
pub(crate) async fn port(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: HeaderMap,
    Path((id, port)): Path<(String, u16)>,
) -> Result<Response, PageError> {
    let viewer = ctx.viewer()?;
    let l = ctx.lang;
    let not_found = || {
        PageError::new(
            l,
            StatusCode::NOT_FOUND,
            "not_found",
            format!("reservation {id} publishes no port {port} that you can open"),
        )
    };
    let r = state
        .store
        .get_reservation(&id, &Scope::Tenant(viewer.user.id.clone()))
        .await
        .map_err(|_| not_found())?;
    if !r.http_ports.contains(&port)
        || !crate::teams::may_open_apps(&state, &viewer.user.id, &r).await
    {
        return Err(not_found());
    }
    if r.status != ReservationStatus::Running {
        return Err(PageError::new(
            l,
            StatusCode::CONFLICT,
            "not_running",
            format!(
                "reservation {id} is {}: its ports are open only while it runs",
                r.status.as_str()
            ),
        ));
    }
    let grant = ProxyGrant {
        reservation_id: r.id,
        port,
        user_id: viewer.user.id.clone(),
    };
    to_app(&state, &ctx, &headers, grant).await
}

/// A one-time ticket for the app's host and a redirect (303) there with it: the ticket
/// becomes the app's cookie on the apps' site (`access::redeem`).
async fn to_app(
    state: &AppState,
    ctx: &Ctx,
    headers: &HeaderMap,
    grant: ProxyGrant,
) -> Result<Response, PageError> {
    let host = request_host(headers).ok_or_else(|| {
        PageError::new(
            ctx.lang,
            StatusCode::BAD_REQUEST,
            "malformed",
            "the request has no Host header",
        )
    })?;
    let now = state.now();
    let ticket = new_token("gpt");
    let expires_at = now + chrono::Duration::from_std(TICKET_TTL).unwrap_or_default();
    state
        .store
        .add_proxy_token(
            ProxyTokenKind::Ticket,
            &hash_token(&ticket),
            &grant,
            expires_at,
            now,
        )
        .await
        .map_err(|e| PageError::internal(&e.to_string()))?;
    let to = format!(
        "{}?{LINK_PARAM}={}",
        app_url(state, host, &grant.reservation_id, grant.port),
        enc(&ticket)
    );
    Ok(super::redirect(StatusCode::SEE_OTHER, &to, None).into_response())
}
