//! Who a bearer token belongs to: unknown, expired and revoked tokens are 401s that say which.

use axum::http::HeaderMap;
use gpurent_store::TokenCheck;

use crate::auth::{bearer, hash_token, Caller};
use crate::error::ApiError;
use crate::state::AppState;

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
