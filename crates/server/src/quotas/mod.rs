//! GPU quotas: the routes of `gpurent quotas` (an admin gives a team guaranteed GPUs of a type
//! and a borrow limit; members see their teams'). Where work stands is `sched::quota`'s rule,
//! applied in the placement transaction (`store/src/sql/quotas.rs`). Docs: docs/quotas.md.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gpurent_sched::quota::{milli, Quota, WHOLE};
use gpurent_store::{QuotaRow, StoreError};
use gpurent_types::api::{ErrorBody, QuotaInfo, SetQuota};
use gpurent_types::GpuType;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::state::AppState;

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct QuotaKey {
    /// The team (or user), by name.
    team: String,
    /// The GPU type.
    gpu_type: String,
}

/// A number of GPUs (`16`, `1.5`, at most three decimals) in milli-GPUs.
pub(crate) fn gpus_milli(name: &str, text: &str) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::Invalid(format!(
            "{name}: {text:?} is not a number of GPUs (like 16 or 1.5, at most three decimals)"
        ))
    };
    let (whole, frac) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
    if whole.is_empty() || frac.len() > 3 || !whole.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    if !frac.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let frac: u64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<3}").parse().map_err(|_| bad())?
    };
    if whole > 1_000_000 {
        return Err(bad());
    }
    Ok(whole * WHOLE + frac)
}

/// The id of the team or user named `name`.
async fn tenant_named(state: &AppState, name: &str) -> Result<String, ApiError> {
    match state.store.team_by_name(name).await {
        Ok(team) => Ok(team.id),
        Err(StoreError::NotFound { .. }) => Ok(state.store.user_id_by_name(name).await?),
        Err(e) => Err(e.into()),
    }
}

fn info(row: QuotaRow) -> QuotaInfo {
    QuotaInfo {
        tenant_id: row.tenant_id,
        team: row.tenant_name,
        gpu_type: row.type_key,
        gpus: milli(row.quota.guaranteed),
        borrow_limit: row.quota.borrow_limit.map(milli),
        used: milli(row.used),
        set_at: row.set_at,
    }
}

/// Give a team (or a user) guaranteed GPUs of a type and how many more it may borrow
/// (admins). Lowering it below what runs stops nothing: new work waits.
#[utoipa::path(put, path = "/api/v1/quotas", tag = "quotas", security(("bearer" = [])),
    request_body = SetQuota,
    responses((status = 200, body = QuotaInfo), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn set(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<SetQuota>,
) -> Result<Json<QuotaInfo>, ApiError> {
    let gpu_type =
        GpuType::parse(&body.gpu_type).map_err(|e| ApiError::Invalid(format!("gpu_type: {e}")))?;
    let quota = Quota {
        guaranteed: gpus_milli("gpus", &body.gpus)?,
        borrow_limit: body
            .borrow_limit
            .as_deref()
            .map(|b| gpus_milli("borrow_limit", b))
            .transpose()?,
    };
    let tenant = tenant_named(&state, &body.team).await?;
    state
        .store
        .set_quota(&tenant, gpu_type.key(), quota, state.now())
        .await?;
    tracing::info!(%tenant, gpu_type = %gpu_type.key(), guaranteed = quota.guaranteed, borrow_limit = ?quota.borrow_limit, by = %caller.0.id, "quota set");
    let row = state
        .store
        .quotas()
        .await?
        .into_iter()
        .find(|q| q.tenant_id == tenant && q.type_key == gpu_type.key())
        .ok_or_else(|| ApiError::Internal("the quota just set is not there".into()))?;
    Ok(Json(info(row)))
}

/// The quotas: every one for an admin; yours and your teams' for anyone else, with what each
/// uses now.
#[utoipa::path(get, path = "/api/v1/quotas", tag = "quotas", security(("bearer" = [])),
    responses((status = 200, body = [QuotaInfo])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<QuotaInfo>>, ApiError> {
    let mut out = Vec::new();
    for row in state.store.quotas().await? {
        let mine = caller.is_admin()
            || match &caller.1.team_id {
                Some(bound) => *bound == row.tenant_id,
                None => {
                    row.tenant_id == caller.0.id
                        || state
                            .store
                            .team_role(&row.tenant_id, &caller.0.id)
                            .await?
                            .is_some()
                }
            };
        if mine {
            out.push(info(row));
        }
    }
    Ok(Json(out))
}

/// Remove a quota (admins): its team uses what is free, borrowed.
#[utoipa::path(delete, path = "/api/v1/quotas", tag = "quotas", security(("bearer" = [])),
    params(QuotaKey),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(key): ApiQuery<QuotaKey>,
) -> Result<StatusCode, ApiError> {
    let gpu_type =
        GpuType::parse(&key.gpu_type).map_err(|e| ApiError::Invalid(format!("gpu_type: {e}")))?;
    let tenant = tenant_named(&state, &key.team).await?;
    if !state.store.remove_quota(&tenant, gpu_type.key()).await? {
        return Err(ApiError::Store(StoreError::NotFound {
            what: "quota of",
            id: format!("{} on {}", key.team, gpu_type.key()),
        }));
    }
    tracing::info!(%tenant, gpu_type = %gpu_type.key(), by = %caller.0.id, "quota removed");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn gpus_are_decimals_of_up_to_three_places() {
        assert_eq!(gpus_milli("gpus", "16").unwrap(), 16_000);
        assert_eq!(gpus_milli("gpus", "1.5").unwrap(), 1_500);
        assert_eq!(gpus_milli("gpus", "0.125").unwrap(), 125);
        for bad in ["", "-1", "1.2345", "x", "1e3", ".5", "1.5.0", "2000000"] {
            assert!(gpus_milli("gpus", bad).is_err(), "{bad}");
        }
    }
}
