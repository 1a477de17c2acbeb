//! Nodes for admins: join tokens for new agents, and the inventory.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gpurent_types::api::{ErrorBody, JoinToken, Node};
use gpurent_types::Role;

use crate::auth::{hash_token, new_token, Caller};
use crate::error::ApiError;
use crate::state::AppState;

/// How long a join token may be used to register agents.
const JOIN_TOKEN_TTL: chrono::Duration = chrono::Duration::hours(24);

/// Make a join token (admin or host) for `gpurent agent --join-token`. Valid for 24 hours;
/// the nodes it registers belong to the caller, who earns the host share of their work.
#[utoipa::path(post, path = "/api/v1/nodes/join-token", tag = "nodes", security(("bearer" = [])),
    responses((status = 201, body = JoinToken), (status = 403, body = ErrorBody)))]
pub(crate) async fn create_join_token(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<(StatusCode, Json<JoinToken>), ApiError> {
    caller.require_role(&[Role::Admin, Role::Host])?;
    let token = new_token("gpj");
    let now = state.now();
    let expires_at = now + JOIN_TOKEN_TTL;
    state
        .store
        .create_join_token(&hash_token(&token), &caller.0.id, expires_at, now)
        .await?;
    Ok((StatusCode::CREATED, Json(JoinToken { token, expires_at })))
}

/// Nodes and their GPUs: all of them for an admin, a host's own for a host.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", security(("bearer" = [])),
    responses((status = 200, body = [Node]), (status = 403, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<Node>>, ApiError> {
    caller.require_role(&[Role::Admin, Role::Host])?;
    let owner = (!caller.is_admin()).then_some(caller.0.id.as_str());
    Ok(Json(
        state.store.list_nodes(state.live_since(), owner).await?,
    ))
}
