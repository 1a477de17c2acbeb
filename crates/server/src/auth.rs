//! Who makes a request: bearer tokens (random, shown once, stored as SHA-256 hashes), the
//! caller they belong to (unknown, expired and revoked tokens are 401s that say which), and the
//! extractors handlers take it from (`Caller`, `AgentNode`). Which role may call what is `policy.rs`'s.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use gpurent_store::{AuthUser, TokenCheck, TokenFacts};
use gpurent_types::Role;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::AppState;
use crate::tls::PeerCert;

/// A new random token with a prefix that says what it is for (`gpr_` user, `gpn_` node,
/// `gpj_` join).
pub fn new_token(prefix: &str) -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{prefix}_{}", hex::encode(bytes))
}

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

pub(crate) fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let header = headers
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

/// Expired and revoked tokens are listed (and named in their 401s) this long, then forgotten
/// by the maintenance loop.
pub(crate) const KEEP_DEAD_TOKENS: chrono::Duration = chrono::Duration::days(30);

/// The caller of a request by its `Authorization: Bearer` token, at the state's clock.
pub(crate) async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    let token = bearer(headers)?;
    match state
        .store
        .check_token(&hash_token(token), state.now())
        .await?
    {
        TokenCheck::Valid(user, token) => Ok(Caller(user, token)),
        TokenCheck::Expired(at) => Err(ApiError::Unauthorized(format!(
            "this token expired at {}; log in again or create a new token",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ))),
        TokenCheck::Revoked(at) => Err(ApiError::Unauthorized(format!(
            "this token was revoked at {}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ))),
        TokenCheck::Unknown => Err(ApiError::Unauthorized("unknown token".into())),
    }
}

/// The authenticated user making a request, and the token it was made with.
#[derive(Debug, Clone)]
pub struct Caller(pub AuthUser, pub TokenFacts);

/// Which roles may call which route is `policy.rs`'s table, enforced before any handler runs.
impl Caller {
    pub fn is_admin(&self) -> bool {
        self.0.role == Role::Admin
    }

    /// Whose reservations the caller sees: a token bound to a team only that team's; else
    /// the user's own and their teams' (an admin: all).
    pub fn scope(&self) -> gpurent_store::Scope {
        match &self.1.team_id {
            Some(team) => gpurent_store::Scope::Tenant(team.clone()),
            None => gpurent_store::Scope::of(&self.0),
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // `policy::authorize` authenticated the caller already; tokens are checked in `authenticate`.
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(caller.clone());
        }
        let caller = authenticate(state, &parts.headers).await?;
        crate::audit::note_caller(&parts.extensions, &caller.0.id);
        Ok(caller)
    }
}

/// The node whose agent makes a request, by its node credential, with its certificate checked
/// (`routes::agent::cert_agrees`: not revoked, and over TLS the connection's own), all from
/// one read of the node.
#[derive(Debug, Clone)]
pub struct AgentNode(pub String);

/// Whether this control plane serves the agent protocol a request's headers name (none: the
/// releases before the header, protocol 1); Err says why not and what to do.
pub fn agent_protocol(headers: &axum::http::HeaderMap) -> Result<(), String> {
    use gpurent_types::agent::{
        agent_protocol_refusal, AGENT_PROTOCOL_HEADER, AGENT_VERSION_HEADER,
    };
    let protocol = match headers.get(AGENT_PROTOCOL_HEADER) {
        None => 1,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .ok_or_else(|| format!("{AGENT_PROTOCOL_HEADER} must be a number"))?,
    };
    let version = headers
        .get(AGENT_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 64 && v.chars().all(|c| c.is_ascii_graphic()));
    agent_protocol_refusal(protocol, version).map_or(Ok(()), Err)
}

impl FromRequestParts<AppState> for AgentNode {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(&parts.headers)?;
        let (node, cert) = state
            .store
            .authenticate_node(&hash_token(token))
            .await?
            .ok_or_else(|| ApiError::Unauthorized("unknown node credential".into()))?;
        crate::audit::note_caller(&parts.extensions, &format!("node:{node}"));
        let peer = match PeerCert::from_request_parts(parts, state).await {
            Ok(peer) => peer,
            Err(never) => match never {},
        };
        crate::routes::agent::cert_agrees(state, &node, &cert, &peer)?;
        if let Err(why) = agent_protocol(&parts.headers) {
            crate::routes::agent::refuse_protocol(state, &node, &why).await;
            return Err(ApiError::AgentProtocol(why));
        }
        Ok(AgentNode(node))
    }
}
