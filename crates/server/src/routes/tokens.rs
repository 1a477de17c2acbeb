//! API tokens of the caller: create (optionally expiring), list, revoke. An admin may list
//! and revoke anyone's; anyone else's token id is a 404 to a non-admin.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use gpurent_store::NewToken;
use gpurent_types::api::{CreateToken, ErrorBody, Token, TokenCreated};
use gpurent_types::TokenScope;

use crate::auth::{hash_token, new_token, Caller};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::pagination::PageQuery;
use crate::state::AppState;
use crate::validate;

/// Longest expiry a token may be given, in days (ten years).
const MAX_EXPIRY_DAYS: u32 = 3650;

/// Create an API token for the caller; the token is shown only in this answer.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "users", security(("bearer" = [])),
    request_body = CreateToken,
    responses((status = 201, body = TokenCreated), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`team`: no team of yours has that name"),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateToken>,
) -> Result<(StatusCode, Json<TokenCreated>), ApiError> {
    if let Some(name) = &body.name {
        if name.chars().count() > 100 {
            return Err(ApiError::Invalid("name: longer than 100 characters".into()));
        }
        validate::printable("name", name)?;
    }
    let asked = match body.expires_in_days {
        None => None,
        Some(days) if (1..=MAX_EXPIRY_DAYS).contains(&days) => {
            Some(state.now() + chrono::Duration::days(i64::from(days)))
        }
        Some(days) => {
            return Err(ApiError::Invalid(format!(
                "expires_in_days: {days} is not between 1 and {MAX_EXPIRY_DAYS}"
            )))
        }
    };
    let (expires_at, parent_id) = match body.password {
        Some(password) => {
            // Re-authenticated (under the login throttle): a credential of its own, as a fresh
            // login would give.
            crate::reauth::check_own(&state, &caller.0, password).await?;
            (asked, None)
        }
        None => (lineage(&caller, asked)?, Some(caller.1.id.clone())),
    };
    let scopes = bounded_scopes(&caller, body.scopes)?;
    let team_id =
        crate::teams::token_team(&state, &caller, body.team.as_deref(), scopes.as_deref()).await?;
    let token = new_token("gpr");
    let info = state
        .store
        .create_token(
            NewToken {
                user_id: caller.0.id.clone(),
                token_hash: hash_token(&token),
                kind: "api",
                name: body.name,
                expires_at,
                parent_id,
                scopes,
                team_id,
            },
            state.now(),
        )
        .await?;
    tracing::info!(user_id = %caller.0.id, token_id = %info.id, "token created");
    Ok((StatusCode::CREATED, Json(TokenCreated { info, token })))
}

/// The scopes of a token made with the caller's: those asked for (each once, at least one),
/// never one the caller's token lacks; none asked: the caller's token's own.
fn bounded_scopes(
    caller: &Caller,
    asked: Option<Vec<TokenScope>>,
) -> Result<Option<Vec<TokenScope>>, ApiError> {
    let Some(mut asked) = asked else {
        return Ok(caller.1.scopes.clone());
    };
    asked.sort_by_key(|s| s.as_str());
    asked.dedup();
    if asked.is_empty() {
        return Err(ApiError::Invalid(
            "scopes: at least one of read, reserve, ssh, volumes, billing, admin (or none given: all of the maker's)".into(),
        ));
    }
    if let Some(wider) = asked.iter().find(|s| !caller.1.allows(**s)) {
        return Err(ApiError::Forbidden(format!(
            "scopes: a token cannot hold more than the token that makes it, and {wider} is not among its scopes"
        )));
    }
    Ok(Some(asked))
}

/// When a token made with the caller's token expires: never after that token, and never
/// at all only for an admin (a tenant's token that never expires was made by one).
fn lineage(
    caller: &Caller,
    asked: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    match (asked, caller.1.expires_at) {
        (Some(asked), Some(parent)) => Ok(Some(asked.min(parent))),
        (None, Some(parent)) => Ok(Some(parent)),
        (asked, None) if asked.is_some() || caller.is_admin() => Ok(asked),
        (_, None) => Err(ApiError::Invalid(
            "expires_in_days: required; a token that never expires needs your password \
             (`password`; gpurent tokens create --with-password) or an admin"
                .into(),
        )),
    }
}

/// The caller's tokens (an admin: everyone's), newest first, never their secrets.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "users", security(("bearer" = [])),
    params(PageQuery),
    responses((status = 200, body = [Token], headers(("X-Next-After" = String,
        description = "The cursor of the next page, when this one is full"))),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let page = query.page()?;
    let owner = (!caller.is_admin()).then_some(caller.0.id.as_str());
    let tokens = state
        .store
        .list_tokens(owner, page.limit, page.after.as_deref())
        .await?;
    let next = page.next_header(tokens.len(), tokens.last().map(|t| t.id.as_str()));
    Ok((axum::response::AppendHeaders(next), Json(tokens)))
}

/// Revoke a token: requests with it get 401 from now on. A non-admin may revoke only its own.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "users", security(("bearer" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = Token), (status = 404, body = ErrorBody)))]
pub(crate) async fn revoke(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Token>, ApiError> {
    let owner = (!caller.is_admin()).then_some(caller.0.id.as_str());
    let token = state.store.revoke_token(&id, owner, state.now()).await?;
    tracing::info!(user_id = %caller.0.id, token_id = %id, "token revoked");
    Ok(Json(token))
}
