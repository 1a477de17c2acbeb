//! Registry credentials: the routes of `gpurent registries` (add, list, remove), and the
//! credential a new reservation's pull uses: its owner's for its image's host, carried sealed
//! in its secrets under a reserved name (docs/images.md).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gpurent_store::NewRegistry;
use gpurent_types::agent::{RegistryAuth, REGISTRY_AUTH_SECRET};
use gpurent_types::api::{
    canonical_host, registry_host, registry_of, AddRegistry, ErrorBody, Registry,
};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::state::AppState;

/// What a registry password is sealed for (it opens for nothing else).
const PURPOSE: &[u8] = b"gpurent-registry-password-v1";
/// The longest host, username and password taken.
const HOST_MAX: usize = 255;
const TEXT_MAX: usize = 4096;

fn check(body: &mut AddRegistry) -> Result<(), ApiError> {
    let host_ok = !body.host.is_empty()
        && body.host.len() <= HOST_MAX
        && body
            .host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        && registry_host(&format!("{}/x", body.host)) == Some(body.host.as_str());
    if !host_ok {
        return Err(ApiError::Invalid(format!(
            "host: a registry host as image names give it (HOST[:PORT], with a dot or a port, or localhost; docker.io for images with no host in their name), got {:?}",
            body.host
        )));
    }
    body.host = canonical_host(&body.host).to_owned();
    if body.username.is_empty() || body.username.len() > TEXT_MAX {
        return Err(ApiError::Invalid(format!(
            "username: 1 to {TEXT_MAX} bytes"
        )));
    }
    crate::validate::printable("username", &body.username)?;
    if body.password.is_empty() || body.password.len() > TEXT_MAX {
        return Err(ApiError::Invalid(format!(
            "password: 1 to {TEXT_MAX} bytes"
        )));
    }
    Ok(())
}

/// Keep a credential for a registry: your pulls from it use it. Replaces the one you had for
/// that host; the password is never shown again.
#[utoipa::path(post, path = "/api/v1/registries", tag = "registries", security(("bearer" = [])),
    request_body = AddRegistry,
    responses((status = 201, body = Registry), (status = 422, body = ErrorBody)))]
pub(crate) async fn add(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(mut body): ApiJson<AddRegistry>,
) -> Result<(StatusCode, Json<Registry>), ApiError> {
    check(&mut body)?;
    let sealed_password =
        crate::secrets::seal_bytes(&*state.config.master_key, body.password.as_bytes(), PURPOSE)?;
    let registry = state
        .store
        .add_registry(
            NewRegistry {
                owner_id: caller.0.id.clone(),
                host: body.host,
                username: body.username,
                sealed_password,
            },
            state.now(),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(registry)))
}

/// Your registry credentials (never their passwords).
#[utoipa::path(get, path = "/api/v1/registries", tag = "registries", security(("bearer" = [])),
    responses((status = 200, body = [Registry])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<Registry>>, ApiError> {
    Ok(Json(state.store.list_registries(&caller.0.id).await?))
}

/// Forget your credential for a registry host.
#[utoipa::path(delete, path = "/api/v1/registries/{host}", tag = "registries", security(("bearer" = [])),
    params(("host" = String, Path, description = "The registry's host")),
    responses((status = 200, body = Registry), (status = 404, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(host): ApiPath<String>,
) -> Result<Json<Registry>, ApiError> {
    Ok(Json(
        state
            .store
            .remove_registry(&caller.0.id, canonical_host(&host))
            .await?,
    ))
}

/// The secret a new reservation of `owner` with `image` carries for its pull: their
/// credential for the image's registry (`docker.io` for an image with no host), if they keep
/// one.
pub(crate) async fn pull_secret(
    state: &AppState,
    owner: &str,
    image: Option<&str>,
) -> Result<Option<(String, String)>, ApiError> {
    let Some(host) = image.map(registry_of) else {
        return Ok(None);
    };
    let Some((username, sealed)) = state.store.registry_secret(owner, host).await? else {
        return Ok(None);
    };
    let password = crate::secrets::open_bytes(&*state.config.master_key, &sealed, PURPOSE)?;
    let auth = RegistryAuth {
        host: host.to_owned(),
        username,
        password: String::from_utf8(password)
            .map_err(|_| ApiError::Internal("a registry password is not UTF-8".into()))?,
    };
    let json = serde_json::to_string(&auth)
        .map_err(|e| ApiError::Internal(format!("a registry credential: {e}")))?;
    Ok(Some((REGISTRY_AUTH_SECRET.to_owned(), json)))
}
