//! `POST /api/v1/reservations/{id}/proxy-links`: a one-time link to a published HTTP port,
//! for a browser (which cannot send a bearer token) to open it.

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

/// A one-time link to a published HTTP port of the caller's reservation: valid 5 minutes,
/// opened once; it sets a cookie for that port (valid 12 hours) and goes on to the app.
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
    // Only the owner: anyone else, an admin too, is told it does not exist.
    let r = state
        .store
        .get_reservation(&id, &Scope::All)
        .await
        .ok()
        .filter(|r| r.tenant_id == caller.0.id)
        .ok_or(gpurent_store::StoreError::NotFound {
            what: "reservation",
            id: id.clone(),
        })?;
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
    let scheme = super::scheme(&state);
    let query = format!("?{}={token}", super::LINK_PARAM);
    let domain_url = state.config.proxy_domain.as_deref().map(|domain| {
        let listener_port = host
            .rsplit_once(':')
            .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
            .map(|(_, p)| format!(":{p}"))
            .unwrap_or_default();
        format!(
            "{scheme}://{}-{}.{}{listener_port}/{query}",
            r.id,
            body.port,
            domain.trim_matches('.')
        )
    });
    tracing::info!(reservation = %r.id, port = body.port, "proxy link made");
    Ok((
        StatusCode::CREATED,
        Json(ProxyLink {
            url: format!(
                "{scheme}://{host}{}{}/{}/{query}",
                super::PREFIX,
                r.id,
                body.port
            ),
            domain_url,
            expires_at,
        }),
    ))
}
