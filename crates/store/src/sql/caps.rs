//! Per-tenant caps on live reservations and spend per hour, checked inside the reserve and
//! enqueue transactions so that concurrent requests cannot pass them together.

use gpurent_types::Money;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::batch::{Answers, Arg, Batch};
use super::fragments::unstopped_statuses;
use crate::{Backend, NewReservation, Result, StoreError, TenantLimits};

const CAPS: &str = "SELECT max_reservations, max_spend_per_hour FROM users WHERE id = $1";

/// Adds to `batch` the read of the tenant's caps; returns its answer's index for [`check`].
pub(super) fn push_read(batch: &mut Batch, tenant_id: &str) -> usize {
    batch.push(CAPS, vec![Arg::from(tenant_id)])
}

/// The tenant's caps in a users row (its overrides, else `defaults`); `None` when it has
/// none.
fn caps_of(row: &AnyRow, defaults: &TenantLimits) -> Result<Option<(i64, Money)>> {
    let max_live = row
        .try_get::<Option<i64>, _>("max_reservations")?
        .unwrap_or(i64::from(defaults.max_reservations));
    let max_spend = row
        .try_get::<Option<i64>, _>("max_spend_per_hour")?
        .map_or(defaults.max_spend_per_hour, Money::from_micros);
    // No cap: nothing to count (a tenant with thousands of live reservations would pay for
    // the count on every reservation), and nothing to lock.
    let uncapped = max_live >= i64::from(u32::MAX) && max_spend.micros() == i64::MAX;
    Ok((!uncapped).then_some((max_live, max_spend)))
}

/// Refuses (`LimitExceeded`) reservation `id` of `new` at `price_per_hour` when it would take
/// the tenant over its cap on live reservations or on spend per hour (its override, else
/// `new.limits`), from the caps [`push_read`] read; `id` itself is not counted, whether or
/// not it is written yet.
///
/// A capped tenant's reservations are serialized from here to commit on PostgreSQL by a lock
/// of its user row (SQLite has one writer), so that the counts read below include every
/// reservation committed before. Checked late in the transaction, after the GPUs, so that
/// what one tenant's reservations wait for each other is short.
pub(super) async fn check(
    conn: &mut AnyConnection,
    backend: Backend,
    answers: &Answers,
    caps_part: usize,
    new: &NewReservation,
    price_per_hour: Money,
    id: &str,
) -> Result<()> {
    let (tenant_id, defaults) = (new.tenant_id.as_str(), &new.limits);
    let row = answers
        .rows(caps_part)
        .first()
        .ok_or_else(|| StoreError::not_found("user", tenant_id))?;
    if caps_of(row, defaults)?.is_none() {
        return Ok(());
    }
    let locked;
    let row = match backend {
        Backend::Sqlite => row,
        Backend::Postgres => {
            // Read again under the lock: what counts is the caps as they are now.
            locked = sqlx::query(
                "UPDATE users SET max_reservations = max_reservations WHERE id = $1
                 RETURNING max_reservations, max_spend_per_hour",
            )
            .bind(tenant_id)
            .fetch_optional(&mut *conn)
            .await?
            .ok_or_else(|| StoreError::not_found("user", tenant_id))?;
            &locked
        }
    };
    let Some((max_live, max_spend)) = caps_of(row, defaults)? else {
        return Ok(());
    };
    let row = sqlx::query(concat!(
        "SELECT COUNT(*) AS live, CAST(COALESCE(SUM(price_per_hour), 0) AS BIGINT) AS spend
             FROM reservations WHERE tenant_id = $1 AND id <> $2 AND status IN ",
        unstopped_statuses!()
    ))
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
