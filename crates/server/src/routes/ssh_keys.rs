//! SSH public keys of the caller: add, list, remove. The SSH endpoint lets a key into the
//! running reservations of its user. An admin may list and remove anyone's; anyone else's key
//! id is a 404 to a non-admin.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use gpurent_store::NewSshKey;
use gpurent_types::api::{AddSshKey, ErrorBody, SshKey};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::pagination::PageQuery;
use crate::state::AppState;
use crate::{ssh_keys, validate};

/// Add an SSH public key for the caller (ed25519, ECDSA, or RSA of at least 3072 bits). With
/// a login session older than 5 minutes it needs the caller's `password` (a key gets a shell
/// in every running instance of the user).
#[utoipa::path(post, path = "/api/v1/ssh-keys", tag = "users", security(("bearer" = [])),
    request_body = AddSshKey,
    responses((status = 201, body = SshKey), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn add(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<AddSshKey>,
) -> Result<(StatusCode, Json<SshKey>), ApiError> {
    let key = ssh_keys::check(&body.public_key).map_err(|e| ApiError::Invalid(e.to_string()))?;
    crate::reauth::recent(&state, &caller, body.password, "adding an SSH key").await?;
    let name = match body.name {
        Some(name) => {
            if name.trim().is_empty() || name.chars().count() > 100 {
                return Err(ApiError::Invalid("name: 1 to 100 characters".into()));
            }
            validate::printable("name", &name)?;
            name
        }
        // The comment of a .pub file is the usual label (`user@host`), if a person can read it.
        None if !key.comment.is_empty()
            && key.comment.chars().count() <= 100
            && validate::printable("name", &key.comment).is_ok() =>
        {
            key.comment.clone()
        }
        None => key.algorithm.clone(),
    };
    let added = state
        .store
        .add_ssh_key(
            NewSshKey {
                user_id: caller.0.id.clone(),
                name,
                algorithm: key.algorithm,
                fingerprint: key.fingerprint,
                public_key: key.openssh,
            },
            state.now(),
        )
        .await?;
    tracing::info!(user_id = %caller.0.id, key_id = %added.id, fingerprint = %added.fingerprint, "ssh key added");
    Ok((StatusCode::CREATED, Json(added)))
}

/// The caller's SSH keys (an admin: everyone's), newest first.
#[utoipa::path(get, path = "/api/v1/ssh-keys", tag = "users", security(("bearer" = [])),
    params(PageQuery),
    responses((status = 200, body = [SshKey], headers(("X-Next-After" = String,
        description = "The cursor of the next page, when this one is full"))),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let page = query.page()?;
    let owner = (!caller.is_admin()).then_some(caller.0.id.as_str());
    let keys = state
        .store
        .list_ssh_keys(owner, page.limit, page.after.as_deref())
        .await?;
    let next = page.next_header(keys.len(), keys.last().map(|k| k.id.as_str()));
    Ok((axum::response::AppendHeaders(next), Json(keys)))
}

/// Remove an SSH key: it gets into nothing from now on. A non-admin may remove only its own.
#[utoipa::path(delete, path = "/api/v1/ssh-keys/{id}", tag = "users", security(("bearer" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = SshKey), (status = 404, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SshKey>, ApiError> {
    let owner = (!caller.is_admin()).then_some(caller.0.id.as_str());
    let key = state.store.remove_ssh_key(&id, owner).await?;
    tracing::info!(user_id = %caller.0.id, key_id = %id, fingerprint = %key.fingerprint, "ssh key removed");
    Ok(Json(key))
}
