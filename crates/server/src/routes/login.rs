//! Console logins by password (throttled per account, `reauth.rs`), and setting a password.

use axum::extract::State;
use axum::Json;
use gpurent_store::NewToken;
use gpurent_types::api::{ErrorBody, Login, Session, SetPassword};

use crate::audit::AuditNote;
use crate::auth::{hash_token, new_token, Caller};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::password;
use crate::reauth::{self, MAX_PASSWORD};
use crate::state::AppState;

const MIN_PASSWORD: usize = 8;

/// Log in with a name and password: the answer holds a session token that expires (12 hours
/// by default). A wrong password and an unknown name get the same 401 in the same time. After
/// 5 failures of one account, whatever the address, each further try waits (30 s, doubling up
/// to 15 minutes): a try during the wait is a 429 with `Retry-After`, its password unchecked.
#[utoipa::path(post, path = "/api/v1/login", tag = "users", request_body = Login,
    responses((status = 200, body = Session), (status = 401, body = ErrorBody)))]
pub(crate) async fn login(
    State(state): State<AppState>,
    note: AuditNote,
    ApiJson(body): ApiJson<Login>,
) -> Result<Json<Session>, ApiError> {
    let facts = reauth::login(&state, &note, &body.name, body.password).await?;
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
                scopes: None,
                team_id: None,
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
/// is a 404 to a non-admin. Your own password needs `current_password` once you have one; an
/// admin setting another's needs its own in `current_password` when its login session is
/// older than 5 minutes. Every other login session of the user ends (and the tokens made
/// from them); API tokens made deliberately stay.
#[utoipa::path(post, path = "/api/v1/users/{id}/password", tag = "users",
    security(("bearer" = [])), params(("id" = String, Path)), request_body = SetPassword,
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn set_password(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SetPassword>,
) -> Result<axum::http::StatusCode, ApiError> {
    // `me`: the caller (`gpurent users passwd` without an id).
    let id = if id == "me" { caller.0.id.clone() } else { id };
    let own = caller.0.id == id;
    if !caller.is_admin() && !own {
        return Err(gpurent_store::StoreError::NotFound { what: "user", id }.into());
    }
    let n = body.password.chars().count();
    if !(MIN_PASSWORD..=MAX_PASSWORD).contains(&n) {
        return Err(ApiError::Invalid(format!(
            "password: {n} characters; it needs {MIN_PASSWORD} to {MAX_PASSWORD}"
        )));
    }
    // Checked even where it is not needed: a request the schema rejects is rejected.
    if let Some(current) = &body.current_password {
        let n = current.chars().count();
        if !(1..=MAX_PASSWORD).contains(&n) {
            return Err(ApiError::Invalid(format!(
                "current_password: {n} characters; it needs 1 to {MAX_PASSWORD}"
            )));
        }
    }
    if own {
        // Always the current one, however fresh the login: a session alone never changes it.
        if reauth::has_password(&state, &caller.0).await? {
            let current = body.current_password.ok_or_else(|| {
                ApiError::PasswordRequired(
                    "current_password: needed to change your password".into(),
                )
            })?;
            reauth::check_own(&state, &caller.0, current).await?;
        }
    } else {
        reauth::recent(
            &state,
            &caller,
            body.current_password,
            "setting another user's password",
        )
        .await?;
    }
    let hashed = password::hash_blocking(body.password)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let keep = own.then_some(caller.1.id.as_str());
    let ended = state
        .store
        .set_password(&id, &hashed, keep, state.now())
        .await?;
    tracing::info!(user_id = %id, by = %caller.0.id, sessions_ended = ended, "password set");
    Ok(axum::http::StatusCode::NO_CONTENT)
}
