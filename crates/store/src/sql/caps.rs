//! Per-tenant caps on live reservations and spend per hour, checked inside the reserve and
//! enqueue transactions so that concurrent requests cannot pass them together.

use gpurent_types::Money;
use sqlx::{AnyConnection, Row};

use crate::{Result, StoreError, TenantLimits};

/// Refuses (`LimitExceeded`) a reservation at `price_per_hour` that would take the tenant
/// over its cap on live reservations or on spend per hour (its override, else `defaults`).
///
/// Where a cap applies, the tenant's user row is locked before its reservations are counted
/// (PostgreSQL; SQLite has one writer), so that concurrent requests of one tenant are counted
/// one after the other. Without a cap nothing is counted or locked: a tenant's reservations
/// then do not wait for each other here.
pub(super) async fn check_caps(
    conn: &mut AnyConnection,
    tenant_id: &str,
    defaults: &TenantLimits,
    price_per_hour: Money,
) -> Result<()> {
    let read = |lock: bool| {
        sqlx::query(if lock {
            // A no-op update: the row lock, and the caps as they are once it is held.
            "UPDATE users SET max_reservations = max_reservations WHERE id = $1
             RETURNING max_reservations, max_spend_per_hour"
        } else {
            "SELECT max_reservations, max_spend_per_hour FROM users WHERE id = $1"
        })
        .bind(tenant_id)
    };
    let caps = |row: Option<sqlx::any::AnyRow>| -> Result<(i64, Money)> {
        let row = row.ok_or_else(|| StoreError::not_found("user", tenant_id))?;
        let max_live = row
            .try_get::<Option<i64>, _>("max_reservations")?
            .unwrap_or(i64::from(defaults.max_reservations));
        let max_spend = row
            .try_get::<Option<i64>, _>("max_spend_per_hour")?
            .map_or(defaults.max_spend_per_hour, Money::from_micros);
        Ok((max_live, max_spend))
    };
    let uncapped = |(max_live, max_spend): (i64, Money)| {
        max_live >= i64::from(u32::MAX) && max_spend.micros() == i64::MAX
    };
    if uncapped(caps(read(false).fetch_optional(&mut *conn).await?)?) {
        // No cap: nothing to count (a tenant with thousands of live reservations would pay
        // for the count on every reservation), and nothing to wait for.
        return Ok(());
    }
    let (max_live, max_spend) = caps(read(true).fetch_optional(&mut *conn).await?)?;
    if uncapped((max_live, max_spend)) {
        return Ok(());
    }
    let row = sqlx::query(
        "SELECT COUNT(*) AS live, CAST(COALESCE(SUM(price_per_hour), 0) AS BIGINT) AS spend
         FROM reservations
         WHERE tenant_id = $1 AND status IN ('pending', 'starting', 'running')",
    )
    .bind(tenant_id)
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
