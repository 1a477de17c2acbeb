//! Per-tenant caps on live reservations and spend per hour, checked inside the reserve and
//! enqueue transactions so that concurrent requests cannot pass them together.

use gpurent_billing::budget::month_of;
use gpurent_types::Money;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::batch::{Answers, Arg, Batch};
use super::fragments::unstopped_statuses;
use super::from_ts;
use crate::{Backend, NewReservation, Result, StoreError, TenantLimits};

const CAPS: &str =
    "SELECT max_reservations, max_spend_per_hour, over_budget FROM users WHERE id = $1";

/// Adds to `batch` the read of the tenant's caps; returns its answer's index for [`check`].
pub(super) fn push_read(batch: &mut Batch, tenant_id: &str) -> usize {
    batch.push(CAPS, vec![Arg::from(tenant_id)])
}

/// A tenant's caps: the most live reservations, and the most spend per hour.
pub(super) type Caps = (i64, Money);

/// The tenant's caps in a users row (its overrides, else `defaults`); `None` when it has
/// none.
pub(super) fn caps_of(row: &AnyRow, defaults: &TenantLimits) -> Result<Option<Caps>> {
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

/// The reads of a capped tenant's usage in a batch ([`push_usage`]).
pub(super) struct Usage {
    /// The caps read again under the lock of the user row (PostgreSQL).
    lock: Option<usize>,
    count: usize,
}

/// Adds to `batch` the count of a capped tenant's live reservations and their spend per
/// hour, but for `except` (a reservation of this transaction): a user's own and those they
/// made for teams (`created_by`), so that nobody passes their caps through a team. On PostgreSQL the tenant's
/// reservations are serialized from here to commit by a lock of its user row (SQLite has one
/// writer), so that the count includes every reservation committed before, and the caps are
/// read again under it: what counts is the caps as they are now.
pub(super) fn push_usage(
    batch: &mut Batch,
    backend: Backend,
    tenant_id: &str,
    except: &str,
) -> Usage {
    let lock = (backend == Backend::Postgres).then(|| {
        batch.push(
            "UPDATE users SET max_reservations = max_reservations WHERE id = $1
             RETURNING max_reservations, max_spend_per_hour",
            vec![Arg::from(tenant_id)],
        )
    });
    let count = batch.push(
        concat!(
            // Two index searches (an OR of the two columns scans every live reservation).
            "SELECT COUNT(*) AS live, CAST(COALESCE(SUM(p), 0) AS BIGINT) AS spend FROM (
               SELECT price_per_hour AS p FROM reservations
               WHERE tenant_id = $1 AND id <> $2 AND status IN ",
            unstopped_statuses!(),
            " UNION ALL
               SELECT price_per_hour FROM reservations
               WHERE created_by = $1 AND tenant_id <> $1 AND id <> $2 AND status IN ",
            unstopped_statuses!(),
            ") counted"
        ),
        vec![Arg::from(tenant_id), Arg::from(except)],
    );
    Usage { lock, count }
}

/// What [`push_usage`] read: the caps (read again under the lock, else `caps`), the live
/// reservations and their spend per hour.
pub(super) fn usage_in(
    answers: &Answers,
    usage: &Usage,
    caps: Option<Caps>,
    tenant_id: &str,
    defaults: &TenantLimits,
) -> Result<(Option<Caps>, i64, Money)> {
    let caps = match usage.lock {
        Some(part) => {
            let row = answers
                .rows(part)
                .first()
                .ok_or_else(|| StoreError::not_found("user", tenant_id))?;
            caps_of(row, defaults)?
        }
        None => caps,
    };
    let row = answers
        .rows(usage.count)
        .first()
        .ok_or_else(|| StoreError::Corrupt("a count returned no row".to_owned()))?;
    Ok((
        caps,
        row.try_get("live")?,
        Money::from_micros(row.try_get("spend")?),
    ))
}

/// Whose caps a count is held against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Whose {
    /// The tenant that pays: a user, or a team.
    Tenant,
    /// The member who makes a team's reservation: theirs and those they made for teams.
    Maker,
}

/// Why a tenant (or a team's member, `whose`) with `live` reservations spending `spend` per
/// hour may not add one at `price_per_hour` under caps of `max_live` and `max_spend`; `None`
/// when it may.
pub(super) fn refusal(
    max_live: i64,
    max_spend: Money,
    live: i64,
    spend: Money,
    price_per_hour: Money,
    whose: Whose,
) -> Option<StoreError> {
    let (per, has) = match whose {
        Whose::Tenant => (
            "per tenant (a user's counting those they made for teams)",
            "this tenant has",
        ),
        Whose::Maker => ("per user, counting those made for teams,", "you have"),
    };
    if live >= max_live {
        return Some(StoreError::LimitExceeded(format!(
            "at most {max_live} live reservations {per} and {has} {live}; \
             stop one, or ask an admin to raise max_reservations"
        )));
    }
    let total = Money::from_micros(spend.micros().saturating_add(price_per_hour.micros()));
    if total > max_spend {
        return Some(StoreError::LimitExceeded(format!(
            "at most {max_spend} per hour of live reservations {per} and {has} {spend} per \
             hour, and this one adds {price_per_hour}; stop one, or ask an admin to raise \
             max_spend_per_hour"
        )));
    }
    None
}

/// Refuses (`BudgetExceeded`) a tenant over its monthly budget in the month of `at`, and
/// (`LimitExceeded`) reservation `id` of `new` at `price_per_hour` when it would take
/// the tenant over its cap on live reservations or on spend per hour (its override, else
/// `new.limits`), from the caps [`push_read`] read; `id` itself is not counted, whether or
/// not it is written yet. Checked late in the transaction, after the GPUs, so that what one
/// tenant's reservations wait for each other is short (see [`push_usage`]).
#[allow(clippy::too_many_arguments)]
pub(super) async fn check(
    conn: &mut AnyConnection,
    backend: Backend,
    answers: &Answers,
    caps_part: usize,
    new: &NewReservation,
    price_per_hour: Money,
    id: &str,
    at: i64,
) -> Result<()> {
    let (tenant_id, defaults) = (new.tenant_id.as_str(), &new.limits);
    let row = answers
        .rows(caps_part)
        .first()
        .ok_or_else(|| StoreError::not_found("user", tenant_id))?;
    // Its spend reached its monthly budget this month (`over_budget`, marked by the budget
    // pass): nothing new until the month ends or the budget is raised.
    if let Some(month) = row.try_get::<Option<String>, _>("over_budget")? {
        if month == month_of(from_ts(at)?).2 {
            return Err(StoreError::BudgetExceeded(format!(
                "the monthly budget is spent for {month}; raise it (gpurent budget set) or \
                 wait for the next month"
            )));
        }
    }
    if let Some(caps) = caps_of(row, defaults)? {
        let mut batch = Batch::default();
        let usage = push_usage(&mut batch, backend, tenant_id, id);
        let counted = batch.run(conn, backend).await?;
        let (caps, live, spend) = usage_in(&counted, &usage, Some(caps), tenant_id, defaults)?;
        if let Some((max_live, max_spend)) = caps {
            if let Some(e) = refusal(
                max_live,
                max_spend,
                live,
                spend,
                price_per_hour,
                Whose::Tenant,
            ) {
                return Err(e);
            }
        }
    }
    // A team's reservation counts against the member who makes it too (after the team's
    // lock: a team's row is always locked before a member's).
    match new.created_by.as_deref() {
        Some(maker) if maker != tenant_id => {
            check_maker(conn, backend, maker, defaults, price_per_hour, id).await
        }
        _ => Ok(()),
    }
}

/// [`check`] for the member `maker` who makes a team's reservation `id`: their caps (their
/// override, else `defaults`) against their own live reservations and those they made for
/// teams.
async fn check_maker(
    conn: &mut AnyConnection,
    backend: Backend,
    maker: &str,
    defaults: &TenantLimits,
    price_per_hour: Money,
    id: &str,
) -> Result<()> {
    let mut batch = Batch::default();
    let read = push_read(&mut batch, maker);
    let usage = push_usage(&mut batch, backend, maker, id);
    let answers = batch.run(conn, backend).await?;
    let row = answers
        .rows(read)
        .first()
        .ok_or_else(|| StoreError::not_found("user", maker))?;
    let caps = caps_of(row, defaults)?;
    let (caps, live, spend) = usage_in(&answers, &usage, caps, maker, defaults)?;
    match caps.and_then(|(max_live, max_spend)| {
        refusal(
            max_live,
            max_spend,
            live,
            spend,
            price_per_hour,
            Whose::Maker,
        )
    }) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
