//! Per-tenant caps on live reservations and spend per hour, checked inside the reserve and
//! enqueue transactions so that concurrent requests cannot pass them together.

use gpurent_types::Money;
use sqlx::{AnyConnection, Row};

use super::batch::{Answers, Arg, Batch};
use crate::{Backend, NewReservation, Result, StoreError};

/// Adds to `batch` the read of the tenant's caps; returns its answer's index for [`check`].
///
/// On PostgreSQL the caps are read by locking the tenant's user row (SQLite has one writer),
/// which serializes the tenant's reservations from there to commit: the counts `check` reads
/// include every reservation committed before. Read late in the transaction, after the GPUs,
/// so that what one tenant's reservations wait for each other is short.
pub(super) fn push_read(batch: &mut Batch, backend: Backend, tenant_id: &str) -> usize {
    let sql = match backend {
        Backend::Sqlite => "SELECT max_reservations, max_spend_per_hour FROM users WHERE id = $1",
        Backend::Postgres => {
            "UPDATE users SET max_reservations = max_reservations WHERE id = $1
             RETURNING max_reservations, max_spend_per_hour"
        }
    };
    batch.push(sql, vec![Arg::from(tenant_id)])
}

/// Refuses (`LimitExceeded`) reservation `id` of `new` at `price_per_hour` when it would take
/// the tenant over its cap on live reservations or on spend per hour (its override, else
/// `new.limits`), from the caps [`push_read`] read; `id` itself is not counted, whether or
/// not it is written yet.
pub(super) async fn check(
    conn: &mut AnyConnection,
    answers: &Answers,
    caps_part: usize,
    new: &NewReservation,
    price_per_hour: Money,
    id: &str,
) -> Result<()> {
    let (tenant_id, defaults) = (new.tenant_id.as_str(), &new.limits);
    let caps = answers
        .rows(caps_part)
        .first()
        .ok_or_else(|| StoreError::not_found("user", tenant_id))?;
    let max_live = caps
        .try_get::<Option<i64>, _>("max_reservations")?
        .unwrap_or(i64::from(defaults.max_reservations));
    let max_spend = caps
        .try_get::<Option<i64>, _>("max_spend_per_hour")?
        .map_or(defaults.max_spend_per_hour, Money::from_micros);
    if max_live >= i64::from(u32::MAX) && max_spend.micros() == i64::MAX {
        // No cap: nothing to count (a tenant with thousands of live reservations would pay
        // for the count on every reservation).
        return Ok(());
    }
    let row = sqlx::query(
        "SELECT COUNT(*) AS live, CAST(COALESCE(SUM(price_per_hour), 0) AS BIGINT) AS spend
         FROM reservations
         WHERE tenant_id = $1 AND status IN ('pending', 'starting', 'running') AND id <> $2",
    )
    .bind(tenant_id)
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let live: i64 = row.try_get("live")?;
    let spend = Money::from_micros(row.try_get("spend")?);
    if live >= max_live {
        return Err(StoreError::LimitExceeded(format!(
            "at most {max_live} live reservations per tenant, and this tenant has {live}; \
             stop one, or ask an admin to raise max_reservations"
        )));
    }
    let total = Money::from_micros(spend.micros().saturating_add(price_per_hour.micros()));
    if total > max_spend {
        return Err(StoreError::LimitExceeded(format!(
            "at most {max_spend} per hour of live reservations per tenant; this tenant has \
             {spend} per hour and this one adds {price_per_hour}; stop one, or ask an admin \
             to raise max_spend_per_hour"
        )));
    }
    Ok(())
}
