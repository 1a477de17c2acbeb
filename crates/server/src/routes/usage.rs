//! Usage statements: what a tenant was charged, per reservation and per day.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, NaiveDate, Utc};
use gpurent_types::api::{ErrorBody, Usage};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::state::AppState;

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct UsageQuery {
    /// Start (inclusive): `YYYY-MM-DD` (midnight UTC) or RFC 3339. Default: the beginning.
    from: Option<String>,
    /// End (exclusive), same forms. Default: now (inclusive).
    to: Option<String>,
    /// Whose usage: a team of the caller's (by id), or anyone's for an admin (default: the
    /// caller, or the team their token acts for).
    user_id: Option<String>,
}

pub(crate) fn instant(name: &str, value: &str) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(date) = NaiveDate::parse_from_str(value, "%Y-%m-%d") {
        return Ok(date.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
    }
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            ApiError::Invalid(format!(
                "{name}: {value:?} is not YYYY-MM-DD or an RFC 3339 time"
            ))
        })
}

/// What the caller (or, for an admin, any user) was charged in a time window.
#[utoipa::path(get, path = "/api/v1/usage", tag = "users", security(("bearer" = [])), params(UsageQuery),
    responses((status = 200, body = Usage), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn usage(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> Result<Json<Usage>, ApiError> {
    let user_id = whose(&state, &caller, query.user_id).await?;
    let (from, to) = window(&state, query.from.as_deref(), query.to.as_deref())?;
    Ok(Json(state.store.usage(&user_id, from, to).await?))
}

/// Whose statement: the caller's own (or that of the team their token acts for), a team's of
/// theirs (any role), or for an admin anyone's. Another user's, or an unknown one, is a 404,
/// not an empty statement.
pub(crate) async fn whose(
    state: &AppState,
    caller: &Caller,
    user_id: Option<String>,
) -> Result<String, ApiError> {
    let own = caller.1.team_id.as_ref().unwrap_or(&caller.0.id);
    let not_found = |id: String| gpurent_store::StoreError::NotFound { what: "user", id };
    let user_id = match user_id {
        Some(id) if id != *own && !caller.is_admin() => {
            let member = caller.1.team_id.is_none()
                && state.store.team_role(&id, &caller.0.id).await?.is_some();
            if !member {
                return Err(not_found(id).into());
            }
            id
        }
        Some(id) => id,
        None => own.clone(),
    };
    state.store.get_user(&user_id).await?;
    Ok(user_id)
}

/// [from, to): from the beginning to now by default.
pub(crate) fn window(
    state: &AppState,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<(DateTime<Utc>, DateTime<Utc>), ApiError> {
    let from = from
        .map(|v| instant("from", v))
        .transpose()?
        .unwrap_or(DateTime::UNIX_EPOCH);
    let to = to
        .map(|v| instant("to", v))
        .transpose()?
        .unwrap_or_else(|| state.now() + chrono::Duration::microseconds(1));
    if to < from {
        return Err(ApiError::Invalid("to is before from".into()));
    }
    Ok((from, to))
}
