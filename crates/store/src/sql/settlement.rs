//! Periodic settlement: running reservations are charged every period for the whole seconds
//! they ran since the last settlement, and stopped when the tenant's balance cannot pay for
//! the next period.

use chrono::{DateTime, Utc};
use gpurent_billing::{charge_due, charge_for_seconds};
use gpurent_types::Money;
use sqlx::Row;

use super::ledger::{self, Transfer, PLATFORM_REVENUE};
use super::nodes::bump_version;
use super::{retry_transient, ts, SqlStore};
use crate::Result;

const MICROS: i64 = 1_000_000;

/// What a settlement did, for the maintenance loop.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settled {
    pub reservations: usize,
    /// Nodes whose reservations were stopped for want of credit (their agents must be woken).
    pub stopped_on: Vec<String>,
}

impl SqlStore {
    /// Settles every running reservation whose last settlement is a period old or more.
    pub async fn settle_due(
        &self,
        now: DateTime<Utc>,
        period: std::time::Duration,
    ) -> Result<Settled> {
        let period_micros = i64::try_from(period.as_micros())
            .unwrap_or(i64::MAX)
            .max(MICROS);
        let due: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM reservations
             WHERE status = 'running' AND settled_until IS NOT NULL AND settled_until + $1 <= $2
             ORDER BY id",
        )
        .bind(period_micros)
        .bind(ts(now))
        .fetch_all(&self.pool)
        .await?;
        let mut settled = Settled::default();
        for id in due {
            let stopped =
                retry_transient("settle", || self.settle_one(&id, now, period_micros)).await?;
            settled.reservations += 1;
            if let Some(node) = stopped {
                if !settled.stopped_on.contains(&node) {
                    settled.stopped_on.push(node);
                }
            }
        }
        Ok(settled)
    }

    /// Charges one reservation up to now (never past its hours) under the transfer id
    /// `charge:<id>:<period number>`, so a repeated or concurrent settlement of the same period
    /// charges nothing more; the `charged` compare-and-set makes the losing transaction roll
    /// back. Returns the node to wake when the reservation was stopped for want of credit.
    async fn settle_one(
        &self,
        id: &str,
        now: DateTime<Utc>,
        period_micros: i64,
    ) -> Result<Option<String>> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT tenant_id, node_id, price_per_hour, started_at, duration_s, charged
             FROM reservations WHERE id = $1 AND status = 'running'",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let tenant: String = row.try_get("tenant_id")?;
        let node: Option<String> = row.try_get("node_id")?;
        let price = Money::from_micros(row.try_get("price_per_hour")?);
        let started: i64 = row
            .try_get::<Option<i64>, _>("started_at")?
            .unwrap_or(ts(now));
        let duration_s: i64 = row.try_get("duration_s")?;
        let already = Money::from_micros(row.try_get("charged")?);
        let end = ts(now).min(started.saturating_add(duration_s.saturating_mul(MICROS)));
        let ran = end.saturating_sub(started).max(0);
        let seconds = u64::try_from(ran / MICROS).unwrap_or(0);
        let due = charge_due(price, seconds, already);
        let period = ran / period_micros;
        let account = ledger::user_account(&tenant);
        let total = already.checked_add(due).unwrap_or(already);
        // The reservation row first, as in every transaction (see `sync_once`).
        let updated = sqlx::query(
            "UPDATE reservations SET charged = $1, settled_until = $2
             WHERE id = $3 AND status = 'running' AND charged = $4",
        )
        .bind(total.micros())
        .bind(end)
        .bind(id)
        .bind(already.micros())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if updated != 1 {
            // Someone else settled or ended it meanwhile.
            return Ok(None);
        }
        let transfer_id = format!("charge:{id}:p{period}");
        let moved = ledger::transfer(
            &mut tx,
            Transfer {
                id: &transfer_id,
                debit: &account,
                credit: PLATFORM_REVENUE,
                amount: due.micros(),
                reservation_id: Some(id),
                at: ts(now),
            },
        )
        .await?;
        if !moved && due > Money::ZERO {
            // This period was charged already: roll the whole settlement back.
            return Ok(None);
        }
        // Prepaid: when the balance cannot pay for the next period, the instance stops now
        // and billing stops with it.
        let balance = ledger::balance_of(&mut tx, &account).await?.unwrap_or(0);
        let next_period =
            charge_for_seconds(price, u64::try_from(period_micros / MICROS).unwrap_or(0));
        let mut stopped_on = None;
        if balance < next_period.micros() {
            let stopped = sqlx::query(
                "UPDATE reservations SET status = 'stopping', stop_requested_at = $1,
                    end_reason = 'insufficient_credit'
                 WHERE id = $2 AND status = 'running'",
            )
            .bind(end)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if stopped == 1 {
                if let Some(node) = &node {
                    bump_version(&mut tx, node).await?;
                }
                tracing::info!(reservation_id = id, tenant_id = %tenant, balance, "stopped: not enough credit for the next period");
                stopped_on = node;
            }
        }
        tx.commit().await?;
        Ok(stopped_on)
    }
}
