//! Periodic settlement: running reservations are charged every period for the whole seconds
//! they ran since the last settlement, and stopped when the tenant's balance cannot pay for
//! the next period. Reservations are settled in batches, each one transaction of a few
//! multi-row statements, so that a period of 100,000 running reservations settles in about a
//! second.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpurent_billing::{charge_due, charge_for_seconds};
use gpurent_types::Money;
use sqlx::Row;

use super::ledger::{self, PLATFORM_REVENUE};
use super::nodes::bump_version;
use super::{multi_row, retry_transient, ts, SqlStore};
use crate::{Backend, Result, StoreError};

const MICROS: i64 = 1_000_000;
/// Reservations settled per transaction.
const BATCH: i64 = 5_000;
/// An arbitrary constant naming the settlement lock: one settler at a time across replicas.
const PG_SETTLEMENT_LOCK: i64 = 0x0067_7073_6574_746c;

/// What a settlement did, for the maintenance loop.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settled {
    pub reservations: usize,
    /// Nodes whose reservations were stopped for want of credit (their agents must be woken).
    pub stopped_on: Vec<String>,
}

struct Due {
    id: String,
    account: String,
    node: Option<String>,
    price: Money,
    already: Money,
    due: Money,
    end: i64,
    period: i64,
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
        let mut settled = Settled::default();
        loop {
            let batch = retry_transient("settle", || self.settle_batch(now, period_micros)).await?;
            settled.reservations += batch.reservations;
            for node in batch.stopped_on {
                if !settled.stopped_on.contains(&node) {
                    settled.stopped_on.push(node);
                }
            }
            if i64::try_from(batch.reservations).unwrap_or(i64::MAX) < BATCH {
                return Ok(settled);
            }
        }
    }

    /// One batch in one transaction: charge each reservation up to now (never past its hours)
    /// under the transfer id `charge:<id>:p<period number>`, move the balances, and stop the
    /// reservations of tenants who cannot pay for their next period.
    async fn settle_batch(&self, now: DateTime<Utc>, period_micros: i64) -> Result<Settled> {
        let at = ts(now);
        let clock = std::time::Instant::now();
        let mut tx = self.pool.begin().await?;
        let lock = if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(PG_SETTLEMENT_LOCK)
                .execute(&mut *tx)
                .await?;
            " FOR UPDATE"
        } else {
            ""
        };
        let rows = sqlx::query(&format!(
            "SELECT id, tenant_id, node_id, price_per_hour, started_at, duration_s, charged
             FROM reservations
             WHERE status = 'running' AND settled_until <= $2 - $1
             ORDER BY id LIMIT $3{lock}"
        ))
        .bind(period_micros)
        .bind(at)
        .bind(BATCH)
        .fetch_all(&mut *tx)
        .await?;
        let mut due = Vec::with_capacity(rows.len());
        for row in &rows {
            let started: i64 = row.try_get::<Option<i64>, _>("started_at")?.unwrap_or(at);
            let duration_s: i64 = row.try_get("duration_s")?;
            let price = Money::from_micros(row.try_get("price_per_hour")?);
            let already = Money::from_micros(row.try_get("charged")?);
            let end = at
                .min(started.saturating_add(duration_s.saturating_mul(MICROS)))
                .max(started);
            let ran = end - started;
            let tenant: String = row.try_get("tenant_id")?;
            due.push(Due {
                id: row.try_get("id")?,
                account: ledger::user_account(&tenant),
                node: row.try_get("node_id")?,
                price,
                already,
                due: charge_due(price, u64::try_from(ran / MICROS).unwrap_or(0), already),
                end,
                period: ran / period_micros,
            });
        }
        if due.is_empty() {
            return Ok(Settled::default());
        }
        tracing::debug!(ms = clock.elapsed().as_millis(), "settlement: read");

        // Reservations first, as in every transaction (see `sync_once`).
        multi_row(
            &mut tx,
            due.len(),
            3,
            "UPDATE reservations SET charged = v.column2, settled_until = v.column3 FROM (VALUES ",
            ") AS v WHERE reservations.id = v.column1",
            |i, q| {
                let d = &due[i];
                q.bind(d.id.clone())
                    .bind(d.already.checked_add(d.due).unwrap_or(d.already).micros())
                    .bind(d.end)
            },
        )
        .await?;

        tracing::debug!(
            ms = clock.elapsed().as_millis(),
            "settlement: reservations updated"
        );
        let charged: Vec<&Due> = due.iter().filter(|d| d.due > Money::ZERO).collect();
        let inserted = multi_row(&mut tx, charged.len(), 6, "INSERT INTO transfers (id, debit_account, credit_account, amount, reservation_id, created_at) VALUES ", " ON CONFLICT (id) DO NOTHING", |i, q| {
            let d = charged[i];
            q.bind(format!("charge:{}:p{}", d.id, d.period))
                .bind(d.account.clone())
                .bind(PLATFORM_REVENUE)
                .bind(d.due.micros())
                .bind(d.id.clone())
                .bind(at)
        })
        .await?;
        if inserted != charged.len() as u64 {
            // A period charged twice would mean the rows above were not what they seemed.
            return Err(StoreError::Corrupt(format!(
                "settlement found {} of {} period charges already recorded",
                charged.len() as u64 - inserted,
                charged.len()
            )));
        }

        tracing::debug!(
            ms = clock.elapsed().as_millis(),
            "settlement: transfers inserted"
        );
        // Balances: platform revenue first, then the tenants in id order (see ledger.rs).
        let mut by_account: BTreeMap<&str, i64> = BTreeMap::new();
        for d in &charged {
            *by_account.entry(d.account.as_str()).or_default() += d.due.micros();
        }
        let total: i64 = by_account.values().sum();
        sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
            .bind(total)
            .bind(PLATFORM_REVENUE)
            .execute(&mut *tx)
            .await?;
        let accounts: Vec<(&str, i64)> = by_account.into_iter().collect();
        multi_row(
            &mut tx,
            accounts.len(),
            2,
            "UPDATE accounts SET balance = accounts.balance - v.column2 FROM (VALUES ",
            ") AS v WHERE accounts.id = v.column1",
            |i, q| q.bind(accounts[i].0.to_owned()).bind(accounts[i].1),
        )
        .await?;

        // Prepaid: a tenant whose balance cannot pay for the next period of its reservations
        // has them stopped now; billing stops with them.
        let period_s = u64::try_from(period_micros / MICROS).unwrap_or(0);
        let mut needed: BTreeMap<&str, i64> = BTreeMap::new();
        for d in &due {
            *needed.entry(d.account.as_str()).or_default() +=
                charge_for_seconds(d.price, period_s).micros();
        }
        let mut broke = Vec::new();
        for (account, need) in &needed {
            let balance = ledger::balance_of(&mut tx, account).await?.unwrap_or(0);
            if balance < *need {
                broke.push(*account);
            }
        }
        let stopping: Vec<&Due> = due
            .iter()
            .filter(|d| broke.contains(&d.account.as_str()))
            .collect();
        multi_row(&mut tx, stopping.len(), 2, "UPDATE reservations SET status = 'stopping', end_reason = 'insufficient_credit', stop_requested_at = v.column2 FROM (VALUES ", ") AS v WHERE reservations.id = v.column1 AND reservations.status = 'running'", |i, q| {
            q.bind(stopping[i].id.clone()).bind(stopping[i].end)
        })
        .await?;
        let mut nodes: Vec<String> = stopping.iter().filter_map(|d| d.node.clone()).collect();
        nodes.sort();
        nodes.dedup();
        for node in &nodes {
            bump_version(&mut tx, node).await?;
        }
        tracing::debug!(
            ms = clock.elapsed().as_millis(),
            "settlement: balances moved"
        );
        tx.commit().await?;
        tracing::debug!(ms = clock.elapsed().as_millis(), "settlement: committed");
        if !stopping.is_empty() {
            tracing::info!(
                reservations = stopping.len(),
                "stopped: not enough credit for the next period"
            );
        }
        Ok(Settled {
            reservations: due.len(),
            stopped_on: nodes,
        })
    }
}
