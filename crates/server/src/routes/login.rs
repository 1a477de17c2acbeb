//! Console logins by password, and setting a password.

use axum::extract::State;
use axum::Json;
use gpurent_store::NewToken;
use gpurent_types::api::{ErrorBody, Login, Session, SetPassword};

use crate::auth::{hash_token, new_token, Caller};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::password;
use crate::state::AppState;

const MIN_PASSWORD: usize = 8;
const MAX_PASSWORD: usize = 1024;

/// Log in with a name and password: the answer holds a session token that expires (12 hours
/// by default). A wrong password and an unknown name get the same 401 in the same time.
#[utoipa::path(post, path = "/api/v1/login", tag = "users", request_body = Login,
    responses((status = 200, body = Session), (status = 401, body = ErrorBody)))]
pub(crate) async fn login(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Login>,
) -> Result<Json<Session>, ApiError> {
    let facts = if body.password.len() > MAX_PASSWORD {
        None
    } else {
        state.store.login_facts(&body.name).await?
    };
    let stored = facts.as_ref().and_then(|f| f.password_hash.clone());
    let given = body.password.chars().take(MAX_PASSWORD).collect::<String>();
    // argon2 runs whether or not the user exists (against a dummy hash when not), off the
    // async workers and a few at a time: it takes tens of milliseconds of CPU by design.
    let matches = password::verify_blocking(given, stored).await;
    let Some(facts) = facts.filter(|_| matches) else {
        return Err(ApiError::Unauthorized("wrong name or password".into()));
    };
    let now = state.now();
    let ttl =
        chrono::Duration::from_std(state.config.session_ttl).unwrap_or(chrono::Duration::hours(12));
    let token = new_token("gpr");
    let info = state
        .store
        .create_token(
            NewToken {
                user_id: facts.user_id.clone(),
                token_hash: hash_token(&token),
                kind: "session",
                name: None,
                expires_at: Some(now + ttl),
                parent_id: None,
            },
            now,
        )
        .await?;
    tracing::info!(user_id = %facts.user_id, token_id = %info.id, "logged in");
    Ok(Json(Session {
        user_id: facts.user_id,
        token_id: info.id,
        token,
        expires_at: info.expires_at.unwrap_or(now + ttl),
    }))
}

/// Set a user's password: the user itself (`me` or its id), or an admin. Another user's id
/// is a 404 to a non-admin.
#[utoipa::path(post, path = "/api/v1/users/{id}/password", tag = "users",
    security(("bearer" = [])), params(("id" = String, Path)), request_body = SetPassword,
    responses((status = 204), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn set_password(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SetPassword>,
) -> Result<axum::http::StatusCode, ApiError> {
    // `me`: the caller (`gpurent users passwd` without an id).
    let id = if id == "me" { caller.0.id.clone() } else { id };
    if !caller.is_admin() && caller.0.id != id {
        return Err(gpurent_store::StoreError::NotFound { what: "user", id }.into());
    }
    let n = body.password.chars().count();
    if !(MIN_PASSWORD..=MAX_PASSWORD).contains(&n) {
        return Err(ApiError::Invalid(format!(
            "password: {n} characters; it needs {MIN_PASSWORD} to {MAX_PASSWORD}"
        )));
    }
    let hashed = password::hash_blocking(body.password)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    state.store.set_password(&id, &hashed).await?;
    tracing::info!(user_id = %id, by = %caller.0.id, "password set");
    Ok(axum::http::StatusCode::NO_CONTENT)
}
