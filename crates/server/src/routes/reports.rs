//! Usage reports (admin): a UTC day per tenant, node and GPU, and a week per price tier.

use axum::extract::State;
use axum::Json;
use gpurent_types::api::ErrorBody;
use gpurent_types::report::{DailyReport, WeeklyReport};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::report::{self, window};
use crate::state::AppState;

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DailyQuery {
    /// The UTC day, `YYYY-MM-DD`.
    #[param(required = true, pattern = r"^\d{4}-\d{2}-\d{2}$")]
    date: Option<String>,
}

/// GPU-hours, VRAM-hours, revenue and utilisation of one UTC day per tenant, node and GPU,
/// each GPU's hours, and the timeline of the reservations that held GPUs (admin).
#[utoipa::path(get, path = "/api/v1/reports/daily", tag = "reports", security(("bearer" = [])),
    params(DailyQuery),
    responses((status = 200, body = DailyReport), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn daily(
    State(state): State<AppState>,
    _caller: Caller,
    ApiQuery(query): ApiQuery<DailyQuery>,
) -> Result<Json<DailyReport>, ApiError> {
    let date = query
        .date
        .ok_or_else(|| ApiError::Invalid("date: required, YYYY-MM-DD".into()))?;
    let (date, from, to) = window::day(&date).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let facts = state.store.usage_facts(from, to, true).await?;
    Ok(Json(report::daily(&facts, date, from, to, state.now())))
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct WeeklyQuery {
    /// The ISO week, `YYYY-Www` (default: the last whole week).
    week: Option<String>,
    /// Or the first of seven UTC days, `YYYY-MM-DD`.
    from: Option<String>,
}

/// Spot, on-demand, stepped and reserved compared over seven UTC days: GPU-hours, what was
/// charged and per GPU-hour, preemptions, the hosts' share and the platform's return (admin).
#[utoipa::path(get, path = "/api/v1/reports/weekly", tag = "reports", security(("bearer" = [])),
    params(WeeklyQuery),
    responses((status = 200, body = WeeklyReport), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn weekly(
    State(state): State<AppState>,
    _caller: Caller,
    ApiQuery(query): ApiQuery<WeeklyQuery>,
) -> Result<Json<WeeklyReport>, ApiError> {
    let now = state.now();
    let week = window::week(query.week.as_deref(), query.from.as_deref(), now)
        .map_err(|e| ApiError::Invalid(e.to_string()))?;
    let facts = state.store.usage_facts(week.from, week.to, false).await?;
    Ok(Json(report::weekly(&facts, week, now)))
}
