//! An endpoint's API keys (`gpurent endpoints keys`): made, listed and removed by its owner,
//! kept as their SHA-256, shown once.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gpurent_types::api::{EndpointKey, EndpointKeyCreated, ErrorBody, ENDPOINT_KEY_PREFIX};

use crate::auth::{hash_token, new_token, Caller};
use crate::error::ApiError;
use crate::extract::ApiPath;
use crate::state::AppState;

/// Characters of a key kept to tell it apart (`gpe_` and eight more).
const SHOWN: usize = ENDPOINT_KEY_PREFIX.len() + 8;

/// A new key of the endpoint, shown once: callers send it as `Authorization: Bearer KEY`.
#[utoipa::path(post, path = "/api/v1/endpoints/{name}/keys", tag = "endpoints",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 201, body = EndpointKeyCreated), (status = 404, body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<(StatusCode, Json<EndpointKeyCreated>), ApiError> {
    let row = super::owned(&state, &caller, &name).await?;
    let key = new_token(ENDPOINT_KEY_PREFIX.trim_end_matches('_'));
    let id = uuid::Uuid::new_v4().to_string();
    let now = state.now();
    state
        .store
        .add_endpoint_key(&row.id, &id, &hash_token(&key), &key[..SHOWN], now)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(EndpointKeyCreated {
            id,
            key,
            created_at: now,
        }),
    ))
}

/// The endpoint's keys (never the keys themselves).
#[utoipa::path(get, path = "/api/v1/endpoints/{name}/keys", tag = "endpoints",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = [EndpointKey]), (status = 404, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Vec<EndpointKey>>, ApiError> {
    let row = super::owned(&state, &caller, &name).await?;
    let keys = state.store.endpoint_keys(&row.id).await?;
    Ok(Json(
        keys.into_iter()
            .map(|(id, prefix, created_at)| EndpointKey {
                id,
                prefix,
                created_at,
            })
            .collect(),
    ))
}

/// Remove a key: requests with it are refused from now on.
#[utoipa::path(delete, path = "/api/v1/endpoints/{name}/keys/{id}", tag = "endpoints",
    security(("bearer" = [])), params(("name" = String, Path), ("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, id)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let row = super::owned(&state, &caller, &name).await?;
    state.store.remove_endpoint_key(&row.id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
