//! Monthly budgets: the routes of `gpurent budget` (`pass.rs` marks tenants over their budget,
//! fires their alerts and stops their work at the limit). Docs: docs/budgets.md.

pub(crate) mod pass;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gpurent_billing::budget::{Budget, DEFAULT_ALERT_AT, DEFAULT_LOW_BALANCE_HOURS};
use gpurent_store::BudgetFacts;
use gpurent_types::api::{BudgetAlert, BudgetStatus, ErrorBody, SetBudget};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::state::AppState;
use crate::teams::{acting_for, Payer, TeamAction};

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct BudgetQuery {
    /// A team of the caller's; default: the caller, or the team their token acts for.
    team: Option<String>,
}

fn status_of(
    facts: BudgetFacts,
    team: Option<String>,
    now: chrono::DateTime<chrono::Utc>,
) -> BudgetStatus {
    let (_, _, month) = gpurent_billing::budget::month_of(now);
    BudgetStatus {
        tenant_id: facts.tenant_id,
        team,
        month,
        monthly: facts.budget.monthly,
        alert_at: facts.budget.alert_at,
        stop_at_limit: facts.budget.stop_at_limit,
        low_balance_hours: facts.budget.low_balance_hours,
        spent: facts.spent,
        burn_per_hour: facts.burn_per_hour,
        forecast: gpurent_billing::budget::forecast(facts.spent, facts.burn_per_hour, now),
        balance: facts.balance,
        over: facts.over,
        alerts: facts
            .fired
            .into_iter()
            .map(|(alert, spent, fired_at)| BudgetAlert {
                alert,
                spent,
                fired_at,
            })
            .collect(),
    }
}

/// The budget of `whose` and its month at `now`; a 404 when it has none.
async fn status(
    state: &AppState,
    whose: Payer,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<BudgetStatus, ApiError> {
    let facts = state
        .store
        .budget_facts(&whose.tenant_id, now)
        .await?
        .ok_or_else(|| no_budget(&whose))?;
    Ok(status_of(facts, whose.team, now))
}

fn no_budget(whose: &Payer) -> ApiError {
    let id = whose.team.clone().unwrap_or_else(|| "yours".to_owned());
    ApiError::Store(gpurent_store::StoreError::NotFound {
        what: "budget of",
        id,
    })
}

/// Your budget (or a team's of yours, any role): the month's spend against it, the forecast
/// at the current burn rate and the alerts fired.
#[utoipa::path(get, path = "/api/v1/budget", tag = "billing", security(("bearer" = [])),
    params(BudgetQuery),
    responses((status = 200, body = BudgetStatus), (status = 404, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<BudgetQuery>,
) -> Result<Json<BudgetStatus>, ApiError> {
    let whose = acting_for(&state, &caller, query.team.as_deref(), TeamAction::See).await?;
    let now = state.now();
    Ok(Json(status(&state, whose, now).await?))
}

/// Sets your monthly budget (or a team's: its admins and owners). It counts what the month
/// already spent: set below that, new reservations are refused at once.
#[utoipa::path(put, path = "/api/v1/budget", tag = "billing", security(("bearer" = [])),
    request_body = SetBudget,
    responses((status = 200, body = BudgetStatus), (status = 404, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn set(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<SetBudget>,
) -> Result<Json<BudgetStatus>, ApiError> {
    let whose = acting_for(&state, &caller, body.team.as_deref(), TeamAction::SetBudget).await?;
    crate::teams::own_settings_unscoped(&caller, whose.team.is_none())?;
    let budget = Budget::new(
        body.monthly,
        body.alert_at.as_deref().unwrap_or(&DEFAULT_ALERT_AT),
        body.stop_at_limit,
        body.low_balance_hours.unwrap_or(DEFAULT_LOW_BALANCE_HOURS),
    )
    .map_err(|e| ApiError::Invalid(e.to_string()))?;
    let now = state.now();
    state
        .store
        .set_budget(&whose.tenant_id, &budget, now)
        .await?;
    tracing::info!(tenant_id = %whose.tenant_id, monthly = %budget.monthly, by = %caller.0.id, "budget set");
    // What the month already spent counts now, not at the next pass.
    pass::assess(&state, &whose.tenant_id, now).await?;
    Ok(Json(status(&state, whose, now).await?))
}

/// Removes your budget (or a team's: its admins and owners), and the refusal with it.
#[utoipa::path(delete, path = "/api/v1/budget", tag = "billing", security(("bearer" = [])),
    params(BudgetQuery),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<BudgetQuery>,
) -> Result<StatusCode, ApiError> {
    let whose = acting_for(
        &state,
        &caller,
        query.team.as_deref(),
        TeamAction::SetBudget,
    )
    .await?;
    crate::teams::own_settings_unscoped(&caller, whose.team.is_none())?;
    if !state.store.remove_budget(&whose.tenant_id).await? {
        return Err(no_budget(&whose));
    }
    tracing::info!(tenant_id = %whose.tenant_id, by = %caller.0.id, "budget removed");
    Ok(StatusCode::NO_CONTENT)
}
