//! `POST /api/v1/reservations/{id}/proxy-links`: a one-time link to a published HTTP port,
//! for a browser (which cannot send a bearer token) to open it: `/open/LINK` on the console's
//! site, which only the owner's console session turns into the app (`open.rs`).

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use gpurent_store::{ProxyGrant, ProxyTokenKind, Scope};
use gpurent_types::api::{CreateProxyLink, ErrorBody, ProxyLink};

use crate::auth::{hash_token, new_token, Caller};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::state::AppState;

/// How long a link may wait to be opened.
const LINK_TTL: Duration = Duration::from_secs(5 * 60);

/// A one-time link to a published HTTP port of the caller's reservation (or their team's,
/// where their role may enter it): valid 5 minutes, opened once, in a browser logged in to the
/// console as the user who made the link; it goes on
/// to the app on the apps' site with a cookie for that port there (valid 12 hours). In anyone
/// else's browser it says whose app it is and does nothing.
#[utoipa::path(post, path = "/api/v1/reservations/{id}/proxy-links", tag = "reservations",
    security(("bearer" = [])), params(("id" = String, Path)), request_body = CreateProxyLink,
    responses((status = 201, body = ProxyLink), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateProxyLink>,
) -> Result<(StatusCode, Json<ProxyLink>), ApiError> {
    // A job array's task by its index (`ID[INDEX]`), in the caller's scope.
    let id = crate::arrays::task_id(&state, id, &caller.scope()).await?;
    // Only the owner, or a member of its team who may enter it (by a token bound to no team
    // or to that one): anyone else, an admin too, is told it does not exist.
    let not_found = || gpurent_store::StoreError::NotFound {
        what: "reservation",
        id: id.clone(),
    };
    let r = state
        .store
        .get_reservation(&id, &Scope::All)
        .await
        .ok()
        .filter(|r| {
            caller
                .1
                .team_id
                .as_ref()
                .is_none_or(|team| *team == r.tenant_id && r.team.is_some())
        })
        .ok_or_else(not_found)?;
    if !crate::teams::may_open_apps(&state, &caller.0.id, &r).await {
        return Err(not_found().into());
    }
    if !r.http_ports.contains(&body.port) {
        let published: Vec<String> = r.http_ports.iter().map(u16::to_string).collect();
        return Err(ApiError::Invalid(format!(
            "port: reservation {} does not publish port {} over HTTP (it publishes: {}; \
             reserve with --http-port {})",
            r.id,
            body.port,
            if published.is_empty() {
                "none".to_owned()
            } else {
                published.join(", ")
            },
            body.port
        )));
    }
    let host = super::request_host(&headers)
        .ok_or_else(|| ApiError::Malformed("the request has no Host header".into()))?;
    let now = state.now();
    let expires_at = now + chrono::Duration::from_std(LINK_TTL).unwrap_or_default();
    let token = new_token("gpl");
    state
        .store
        .add_proxy_token(
            ProxyTokenKind::Link,
            &hash_token(&token),
            &ProxyGrant {
                reservation_id: r.id.clone(),
                port: body.port,
                user_id: caller.0.id.clone(),
            },
            expires_at,
            now,
        )
        .await?;
    tracing::info!(reservation = %r.id, port = body.port, "proxy link made");
    Ok((
        StatusCode::CREATED,
        Json(ProxyLink {
            url: format!(
                "{}://{host}{}{token}",
                super::scheme(&state),
                super::open::PREFIX
            ),
            app_url: super::app_url(&state, host, &r.id, body.port),
            expires_at,
        }),
    ))
}
