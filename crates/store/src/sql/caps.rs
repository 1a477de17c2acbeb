//! Per-tenant caps on live reservations and spend per hour, checked inside the reserve and
//! enqueue transactions so that concurrent requests cannot pass them together.

use gpurent_types::Money;
use sqlx::{AnyConnection, Row};

use super::fragments::unstopped_statuses;
use crate::{Result, StoreError, TenantLimits};

/// Serializes the reservations of one tenant: every reserve or enqueue transaction takes
/// the tenant's user row lock first (PostgreSQL; SQLite has one writer), so the counts that
/// `check_caps` reads later in the transaction include every reservation committed before.
pub(super) async fn lock_tenant(conn: &mut AnyConnection, tenant_id: &str) -> Result<()> {
    sqlx::query("UPDATE users SET max_reservations = max_reservations WHERE id = $1")
        .bind(tenant_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Refuses (`LimitExceeded`) a reservation at `price_per_hour` that would take the tenant
/// over its cap on live reservations or on spend per hour (its override, else `defaults`).
pub(super) async fn check_caps(
    conn: &mut AnyConnection,
    tenant_id: &str,
    defaults: &TenantLimits,
    price_per_hour: Money,
) -> Result<()> {
    let caps = sqlx::query("SELECT max_reservations, max_spend_per_hour FROM users WHERE id = $1")
        .bind(tenant_id)
        .fetch_optional(&mut *conn)
        .await?
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
    let row = sqlx::query(concat!(
        "SELECT COUNT(*) AS live, CAST(COALESCE(SUM(price_per_hour), 0) AS BIGINT) AS spend
             FROM reservations WHERE tenant_id = $1 AND status IN ",
        unstopped_statuses!()
    ))
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
