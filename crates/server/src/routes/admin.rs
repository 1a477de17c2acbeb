//! Administration: checks of the platform's own books and the spot success rate.

use axum::extract::State;
use axum::Json;
use gpurent_types::api::{ErrorBody, LedgerMismatch, LedgerReport, SpotStats};
use gpurent_types::Money;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// Recompute every balance from the transfers and check that all balances sum to zero (admin).
#[utoipa::path(get, path = "/api/v1/admin/ledger-check", tag = "users", security(("bearer" = [])),
    responses((status = 200, body = LedgerReport), (status = 403, body = ErrorBody)))]
pub(crate) async fn ledger_check(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Json<LedgerReport>, ApiError> {
    let check = state.store.ledger_check().await?;
    Ok(Json(LedgerReport {
        ok: check.ok(),
        transfers: check.transfers,
        sum: Money::from_micros(check.sum),
        mismatched: check
            .mismatched
            .into_iter()
            .map(|(account, cached, derived)| LedgerMismatch {
                account,
                cached: Money::from_micros(cached),
                derived: Money::from_micros(derived),
            })
            .collect(),
        problems: check.problems,
    }))
}

/// How spot instances ended: the spot success rate (admin).
#[utoipa::path(get, path = "/api/v1/admin/spot", tag = "users", security(("bearer" = [])),
    responses((status = 200, body = SpotStats), (status = 403, body = ErrorBody)))]
pub(crate) async fn spot_stats(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Json<SpotStats>, ApiError> {
    Ok(Json(state.store.spot_stats().await?))
}
