//! Periodic settlement: running reservations are charged every period for the whole seconds
//! they ran since the last settlement, and stopped when the tenant's balance cannot pay for
//! the next period. One transaction of set-based statements settles every reservation that is
//! due, so that a period of 100,000 running reservations settles in about a second.

use chrono::{DateTime, Utc};

use super::ledger::PLATFORM_REVENUE;
use super::nodes::bump_version;
use super::{retry_transient, ts, SqlStore};
use crate::{Backend, Result, StoreError};

const MICROS: i64 = 1_000_000;
/// An arbitrary constant naming the settlement lock: one settler at a time across replicas.
const PG_SETTLEMENT_LOCK: i64 = 0x0067_7073_6574_746c;

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
        // Everything due is settled in one transaction.
        retry_transient("settle", || self.settle_set(now, period_micros)).await
    }

    /// One transaction of set-based statements: what each due reservation owes is computed
    /// by the database itself (the same floor(seconds × price / 3600) as
    /// `gpurent_billing::charge_for_seconds`, checked against it by the tests and the
    /// settlement benchmark), charged under the transfer id `charge:<id>:p<period number>`,
    /// and the reservations of tenants who cannot pay for their next period are stopped.
    async fn settle_set(&self, now: DateTime<Utc>, period_micros: i64) -> Result<Settled> {
        let at = ts(now);
        let cutoff = at.saturating_sub(period_micros);
        let period_s = period_micros / MICROS;
        let clock = std::time::Instant::now();
        let mut tx = self.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(PG_SETTLEMENT_LOCK)
                .execute(&mut *tx)
                .await?;
            // Reservations first, as in every transaction (see `sync_once`).
            sqlx::query("SELECT id FROM reservations WHERE status = 'running' AND settled_until <= $1 ORDER BY id FOR UPDATE")
                .bind(cutoff)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(
            "CREATE TEMP TABLE IF NOT EXISTS settling (
                id TEXT PRIMARY KEY, account TEXT NOT NULL, node_id TEXT, price BIGINT NOT NULL,
                old_charged BIGINT NOT NULL, new_charged BIGINT NOT NULL, end_at BIGINT NOT NULL,
                period BIGINT NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM settling")
            .execute(&mut *tx)
            .await?;
        let count = sqlx::query(
            "INSERT INTO settling (id, account, node_id, price, old_charged, new_charged, end_at, period)
             SELECT id, 'user:' || tenant_id, node_id, price_per_hour, charged,
                    CASE WHEN owed > charged THEN owed ELSE charged END, e, (e - started_at) / $2
             FROM (SELECT id, tenant_id, node_id, price_per_hour, charged, started_at, e,
                          ((e - started_at) / 1000000) * price_per_hour / 3600 AS owed
                   FROM (SELECT id, tenant_id, node_id, price_per_hour, charged, started_at,
                                CASE WHEN $1 < started_at + duration_s * 1000000 THEN $1
                                     ELSE started_at + duration_s * 1000000 END AS e
                         FROM reservations
                         WHERE status = 'running' AND settled_until <= $3) a) b",
        )
        .bind(at)
        .bind(period_micros)
        .bind(cutoff)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if count == 0 {
            return Ok(Settled::default());
        }
        tracing::debug!(
            ms = clock.elapsed().as_millis(),
            count,
            "settlement: computed"
        );
        sqlx::query(
            "UPDATE reservations SET charged = s.new_charged, settled_until = s.end_at
             FROM settling s WHERE reservations.id = s.id",
        )
        .execute(&mut *tx)
        .await?;
        let charges: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM settling WHERE new_charged > old_charged")
                .fetch_one(&mut *tx)
                .await?;
        let inserted = sqlx::query(
            "INSERT INTO transfers (id, debit_account, credit_account, amount, reservation_id, created_at)
             SELECT 'charge:' || id || ':p' || period, account, $1, new_charged - old_charged, id, $2
             FROM settling WHERE new_charged > old_charged
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(PLATFORM_REVENUE)
        .bind(at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if i64::try_from(inserted).unwrap_or(i64::MAX) != charges {
            // A period charged twice would mean the rows above were not what they seemed.
            return Err(StoreError::Corrupt(format!(
                "settlement found {} of {charges} period charges already recorded",
                charges - i64::try_from(inserted).unwrap_or(0)
            )));
        }
        tracing::debug!(
            ms = clock.elapsed().as_millis(),
            "settlement: transfers inserted"
        );
        // Balances: platform revenue first, then the tenants (see ledger.rs).
        sqlx::query(
            "UPDATE accounts SET balance = balance
                + (SELECT CAST(COALESCE(SUM(new_charged - old_charged), 0) AS BIGINT) FROM settling)
             WHERE id = $1",
        )
        .bind(PLATFORM_REVENUE)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE accounts SET balance = accounts.balance - t.total
             FROM (SELECT account, CAST(SUM(new_charged - old_charged) AS BIGINT) AS total
                   FROM settling GROUP BY account) t
             WHERE accounts.id = t.account",
        )
        .execute(&mut *tx)
        .await?;
        tracing::debug!(ms = clock.elapsed().as_millis(), "settlement: charged");

        // Prepaid: a tenant whose balance cannot pay for the next period of its reservations
        // has them stopped now; billing stops with them.
        let mut nodes: Vec<String> = sqlx::query_scalar::<_, Option<String>>(
            "UPDATE reservations SET status = 'stopping', end_reason = 'insufficient_credit',
                stop_requested_at = s.end_at
             FROM settling s
             WHERE reservations.id = s.id AND reservations.status = 'running'
               AND s.account IN (
                   SELECT a.id FROM accounts a
                   JOIN (SELECT account, CAST(SUM(price * $1 / 3600) AS BIGINT) AS need
                         FROM settling GROUP BY account) n ON n.account = a.id
                   WHERE a.balance < n.need)
             RETURNING reservations.node_id",
        )
        .bind(period_s)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .flatten()
        .collect();
        let stopped = nodes.len();
        nodes.sort();
        nodes.dedup();
        for node in &nodes {
            bump_version(&mut tx, node).await?;
        }
        tx.commit().await?;
        tracing::debug!(ms = clock.elapsed().as_millis(), "settlement: committed");
        if stopped > 0 {
            tracing::info!(
                reservations = stopped,
                "stopped: not enough credit for the next period"
            );
        }
        Ok(Settled {
            reservations: usize::try_from(count).unwrap_or(usize::MAX),
            stopped_on: nodes,
        })
    }
}
