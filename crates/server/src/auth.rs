//! Bearer tokens: random, shown once, stored as SHA-256 hashes; extractors for the caller.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use gpurent_store::AuthUser;
use gpurent_types::Role;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::AppState;

/// A new random token with a prefix that says what it is for (`gpr_` user, `gpn_` node,
/// `gpj_` join).
pub fn new_token(prefix: &str) -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{prefix}_{}", hex::encode(bytes))
}

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let header = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| {
            ApiError::Unauthorized("missing Authorization: Bearer TOKEN header".into())
        })?;
    let value = header
        .to_str()
        .map_err(|_| ApiError::Unauthorized("Authorization header is not text".into()))?;
    value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::Unauthorized("Authorization header must be `Bearer TOKEN`".into()))
}

/// The authenticated user making a request.
#[derive(Debug, Clone)]
pub struct Caller(pub AuthUser);

impl Caller {
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.0.role == Role::Admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden("this needs the admin role".into()))
        }
    }

    pub fn require_role(&self, roles: &[Role]) -> Result<(), ApiError> {
        if roles.contains(&self.0.role) {
            Ok(())
        } else {
            let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
            Err(ApiError::Forbidden(format!(
                "this needs one of the roles: {}",
                names.join(", ")
            )))
        }
    }

    pub fn is_admin(&self) -> bool {
        self.0.role == Role::Admin
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(parts)?;
        state
            .store
            .authenticate(&hash_token(token))
            .await?
            .map(Caller)
            .inspect(|caller| note_caller(parts, &caller.0.id))
            .ok_or_else(|| ApiError::Unauthorized("unknown or revoked token".into()))
    }
}

/// Tells the request's audit record who made it.
fn note_caller(parts: &Parts, id: &str) {
    if let Some(note) = parts.extensions.get::<crate::audit::AuditNote>() {
        note.caller(id);
    }
}

/// The node whose agent makes a request, by its node credential.
#[derive(Debug, Clone)]
pub struct AgentNode(pub String);

impl FromRequestParts<AppState> for AgentNode {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(parts)?;
        state
            .store
            .authenticate_node(&hash_token(token))
            .await?
            .map(AgentNode)
            .inspect(|node| note_caller(parts, &format!("node:{}", node.0)))
            .ok_or_else(|| ApiError::Unauthorized("unknown node credential".into()))
    }
}
