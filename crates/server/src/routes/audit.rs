//! The audit trail, for admins: search and export it, read its checkpoints, verify it.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use gpurent_store::AuditFilter;
use gpurent_types::api::{
    AuditCheckpoint, AuditPage, AuditProblem, AuditRecord, AuditVerdict, ErrorBody,
};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::state::AppState;

/// Most records in one answer.
const MAX_RECORDS: u32 = 1000;

/// Which records, and where the page starts.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// Only this user's requests (a user id, or `node:<id>`).
    user: Option<String>,
    /// Only requests on this resource (a path), or on any path or GPU allocation containing it
    /// (a reservation's id finds its creation too).
    resource: Option<String>,
    /// Only requests at or after this time (RFC 3339).
    from: Option<String>,
    /// Only requests before this time (RFC 3339).
    to: Option<String>,
    /// The last position seen (0, the default: from the first).
    #[serde(default)]
    #[param(required = false, maximum = 9_223_372_036_854_775_807_i64)]
    after: u64,
    /// At most this many (default and cap 1000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// An RFC 3339 time of the query, or 422 naming its parameter.
fn time(name: &str, value: Option<&str>) -> Result<Option<DateTime<Utc>>, ApiError> {
    value
        .filter(|v| !v.is_empty())
        .map(|v| {
            DateTime::parse_from_rfc3339(v)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| {
                    ApiError::Invalid(format!("{name}: {v:?} is not an RFC 3339 time: {e}"))
                })
        })
        .transpose()
}

fn record(r: gpurent_audit::Record) -> AuditRecord {
    AuditRecord {
        seq: r.seq,
        request_id: r.entry.request_id,
        at: r.entry.at,
        user_id: r.entry.user_id,
        action: r.entry.action,
        resource: r.entry.resource,
        allocation: r.entry.allocation,
        outcome: r.entry.outcome,
        client: r.entry.client,
        prev_hash: r.prev_hash,
        hash: r.hash,
    }
}

/// Audit records in the order they were written, by user, resource and time (admin).
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", security(("bearer" = [])),
    params(AuditQuery),
    responses((status = 200, body = AuditPage), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn search(
    State(state): State<AppState>,
    _caller: Caller,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    if i64::try_from(query.after).is_err() {
        return Err(ApiError::Invalid(format!(
            "after: {} is not a position",
            query.after
        )));
    }
    let limit = query.limit.unwrap_or(MAX_RECORDS);
    if limit == 0 || limit > MAX_RECORDS {
        return Err(ApiError::Invalid(format!(
            "limit: {limit} is not between 1 and {MAX_RECORDS}"
        )));
    }
    let filter = AuditFilter {
        user_id: query.user.filter(|u| !u.is_empty()),
        resource: query.resource.filter(|r| !r.is_empty()),
        from: time("from", query.from.as_deref())?,
        to: time("to", query.to.as_deref())?,
    };
    let records = state
        .store
        .audit_records(&filter, query.after, limit)
        .await?;
    let full = u32::try_from(records.len()).unwrap_or(u32::MAX) >= limit;
    let next_after = records.last().filter(|_| full).map(|r| r.seq);
    Ok(Json(AuditPage {
        records: records.into_iter().map(record).collect(),
        next_after,
    }))
}

/// The signed checkpoints of the retained trail, its anchor first where it was pruned (admin).
#[utoipa::path(get, path = "/api/v1/audit/checkpoints", tag = "audit",
    security(("bearer" = [])),
    responses((status = 200, body = [AuditCheckpoint]), (status = 403, body = ErrorBody)))]
pub(crate) async fn checkpoints(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Json<Vec<AuditCheckpoint>>, ApiError> {
    let anchor = state.store.audit_anchor().await?;
    let rest = state.store.audit_checkpoints().await?;
    let all = anchor
        .into_iter()
        .map(|c| (c, true))
        .chain(rest.into_iter().map(|c| (c, false)))
        .map(|(c, anchor)| AuditCheckpoint {
            seq: c.seq,
            hash: c.hash,
            at: c.at,
            signature: c.signature,
            public_key: c.public_key,
            anchor,
        })
        .collect();
    Ok(Json(all))
}

/// Verifies the whole retained trail against its chain, its signed checkpoints and its head
/// with the server's key, and names the first record altered, removed or reordered (admin).
#[utoipa::path(get, path = "/api/v1/audit/verify", tag = "audit", security(("bearer" = [])),
    responses((status = 200, body = AuditVerdict), (status = 403, body = ErrorBody)))]
pub(crate) async fn verify(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Json<AuditVerdict>, ApiError> {
    let public_key = state.config.audit.signer.public_key();
    let verdict = gpurent_store::verify_audit(&*state.store, &public_key).await?;
    Ok(Json(AuditVerdict {
        ok: verdict.ok,
        records: verdict.records,
        checkpoints: verdict.checkpoints,
        first_bad: verdict.first_bad.map(|b| AuditProblem {
            seq: b.seq,
            problem: serde_json::to_value(b.problem)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            message: b.message,
        }),
        public_key,
    }))
}
