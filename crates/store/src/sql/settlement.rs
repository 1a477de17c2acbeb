//! Periodic settlement: running reservations are charged every period for the whole seconds
//! they ran since the last settlement, and stopped when the tenant's balance cannot pay for
//! the next period. One transaction of set-based statements settles every reservation that is
//! due, so that a period of 100,000 running reservations settles in about a second.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use gpurent_billing::Rate;
use gpurent_types::Money;
use sqlx::Row;

use super::fragments::ENDS_AT;
use super::ledger::PLATFORM_REVENUE;
use super::nodes::bump_version;
use super::{retry_transient, ts, SqlStore};
use crate::{Backend, Result, StoreError};

const MICROS: i64 = 1_000_000;

/// What a meter's rate charges for `secs` whole seconds, in SQL over the meter's columns:
/// `price_per_hour` for its first `price_step_s` seconds (all of its `duration_s` when flat),
/// `price_after` after, rounded down once on the whole time. It is
/// `gpurent_billing::Rate::charge_for_seconds`, which `SqlStore::settlement_charge` holds it
/// to (a test over both databases).
pub(super) fn charge_sql(secs: &str) -> String {
    let step = "COALESCE(price_step_s, duration_s)";
    let after = "COALESCE(price_after, price_per_hour)";
    format!(
        "(CASE WHEN {secs} <= {step} THEN {secs} * price_per_hour \
         ELSE {step} * price_per_hour + ({secs} - {step}) * {after} END) / 3600"
    )
}

/// The hourly price of a meter's second after `secs` (what its next period is charged at):
/// `gpurent_billing::Rate::per_hour_after`, held to it like `charge_sql`.
pub(super) fn rate_after_sql(secs: &str) -> String {
    format!(
        "CASE WHEN {secs} < COALESCE(price_step_s, duration_s) THEN price_per_hour \
         ELSE COALESCE(price_after, price_per_hour) END"
    )
}

/// A host's part of `charged` at `bps` basis points, rounded down: the SQL of
/// `gpurent_billing::ending::host_part`, held to it like `charge_sql`.
pub(super) fn host_part_sql(charged: &str, bps: &str) -> String {
    format!("{charged} * {bps} / 10000")
}

/// PostgreSQL's settlement of the due meters in one pass, without joining the table to itself:
/// each due meter (`$2`: last settled at or before) is charged up to `$1` (or its end) with
/// `charge_sql`, keeps its previous settlement, charge and hold (`prev_*`: `RETURNING` gives
/// new values only), and returns the columns of `settling`.
static PG_UPDATE: LazyLock<String> = LazyLock::new(|| {
    let until = format!("LEAST($1, {ENDS_AT})");
    let owed = format!(
        "GREATEST(charged, {})",
        charge_sql(&format!("({until} - started_at) / 1000000"))
    );
    format!(
        "UPDATE meters SET prev_settled = settled_until, prev_charged = charged, prev_held = held, \
         settled_until = {until}, charged = {owed}, \
         held = CASE WHEN prepaid_block = 1 THEN held - ({owed} - charged) ELSE 0 END \
         WHERE settled_until <= $2 \
         RETURNING reservation_id AS id, tenant_id, \
         CASE WHEN prepaid_block = 1 THEN 'hold:' ELSE 'user:' END || tenant_id AS account, node_id, \
         prepaid_block AS block, {} AS rate_now, \
         prev_charged AS old_charged, charged AS new_charged, prev_held AS held, host_share_bps AS bps, \
         settled_until AS end_at, prev_settled AS old_settled",
        rate_after_sql("(settled_until - started_at) / 1000000")
    )
});

/// SQLite's (and the statement PostgreSQL's replaces): what each due meter (`$2`: last
/// settled at or before) owes up to `$1` (or its end), by `charge_sql`, in the columns of
/// `settling`.
static DUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT id, tenant_id,
                CASE WHEN block = 1 THEN 'hold:' ELSE 'user:' END || tenant_id AS account,
                node_id, block, {rate_now} AS rate_now,
                charged AS old_charged,
                CASE WHEN owed > charged THEN owed ELSE charged END AS new_charged, held,
                host_share_bps AS bps, e AS end_at, settled_until AS old_settled
         FROM (SELECT id, tenant_id, node_id, block, price_per_hour, price_step_s, price_after,
                      duration_s, charged, held, host_share_bps, started_at, e, secs,
                      settled_until, {owed} AS owed
               FROM (SELECT reservation_id AS id, tenant_id, node_id, charged, held,
                            host_share_bps, started_at, settled_until,
                            prepaid_block AS block, price_per_hour, price_step_s, price_after,
                            duration_s, e, (e - started_at) / 1000000 AS secs
                     FROM (SELECT m.*,
                                  CASE WHEN $1 < {ENDS_AT} THEN $1 ELSE {ENDS_AT} END AS e
                           FROM meters m WHERE settled_until <= $2) a) b) c",
        rate_now = rate_after_sql("secs"),
        owed = charge_sql("secs"),
    )
});

/// An arbitrary constant naming the settlement lock: one settler at a time across replicas.
const PG_SETTLEMENT_LOCK: i64 = 0x0067_7073_6574_746c;

impl SqlStore {
    /// The settlement's own SQL (`charge_sql`, `rate_after_sql`, `host_part_sql`) evaluated by
    /// this database for a meter of `rate` reserved for `duration_s` seconds, after `seconds` of
    /// running, whose host gets `share_bps`: the charge, the hourly price of the next second,
    /// and the host's part of the charge. For the test that holds the settlement to
    /// `gpurent_billing`, on both databases.
    #[doc(hidden)]
    pub async fn settlement_charge(
        &self,
        rate: &Rate,
        duration_s: u64,
        seconds: u64,
        share_bps: u32,
    ) -> Result<(Money, Money, Money)> {
        // A meter stores a rate that does not step within its hours as no step, as
        // `reservations::insert_reservation` writes it.
        let (step, after) = if rate.step_s >= duration_s {
            (None, None)
        } else {
            (
                Some(i64::try_from(rate.step_s).unwrap_or(i64::MAX)),
                Some(rate.then.micros()),
            )
        };
        let row = sqlx::query(&format!(
            "SELECT charge, rate_now, {} AS host_part
             FROM (SELECT {} AS charge, {} AS rate_now, bps
                   FROM (SELECT CAST($1 AS BIGINT) AS price_per_hour,
                                CAST($2 AS BIGINT) AS price_step_s,
                                CAST($3 AS BIGINT) AS price_after,
                                CAST($4 AS BIGINT) AS duration_s, CAST($5 AS BIGINT) AS secs,
                                CAST($6 AS BIGINT) AS bps) m) c",
            host_part_sql("charge", "bps"),
            charge_sql("secs"),
            rate_after_sql("secs")
        ))
        .bind(rate.first.micros())
        .bind(step)
        .bind(after)
        .bind(i64::try_from(duration_s).unwrap_or(i64::MAX))
        .bind(i64::try_from(seconds).unwrap_or(i64::MAX))
        .bind(i64::from(share_bps))
        .fetch_one(&self.pool)
        .await?;
        Ok((
            Money::from_micros(row.try_get("charge")?),
            Money::from_micros(row.try_get("rate_now")?),
            Money::from_micros(row.try_get("host_part")?),
        ))
    }
}

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
    /// by the database itself (`charge_sql`: `gpurent_billing::Rate::charge_for_seconds`,
    /// held to it by a test), charged under the
    /// transfer id `charge:<period start>:<id>` (the period named by the instant, in unix
    /// microseconds, it starts from; time first, so that a period's ids are appended to the
    /// index instead of scattered over it), the first hour held at reservation is given
    /// back (`release:<time>:<tenant>`, one per tenant), each node's owner is paid its share of the period's charges
    /// (`earn:<node>:<time>`), and the reservations of tenants who cannot pay for their next
    /// period are stopped. Reserved blocks are paid from their hold and never stopped.
    async fn settle_set(&self, now: DateTime<Utc>, period_micros: i64) -> Result<Settled> {
        let at = ts(now);
        let cutoff = at.saturating_sub(period_micros);
        let period_s = period_micros / MICROS;
        let clock = std::time::Instant::now();
        let mut tx = self.begin().await?;
        if self.backend == Backend::Postgres {
            // Another replica's settlement of a large period may hold the lock for longer
            // than `lock_timeout`: this one waits for it, then finds little left to do.
            sqlx::query("SET LOCAL lock_timeout = 0")
                .execute(&mut *tx)
                .await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(PG_SETTLEMENT_LOCK)
                .execute(&mut *tx)
                .await?;
            // The joins of a large period hash in memory (instead of sorting on disk, or looking
            // 100,000 rows up one by one: the planner's guess for a fresh period).
            // A settlement lost in a crash is lost whole and done again from the meters at the
            // next period (nothing outside this transaction depends on it), so its commit need
            // not wait for the disk.
            for setting in [
                "SET LOCAL work_mem = '64MB'",
                "SET LOCAL enable_nestloop = off",
                "SET LOCAL synchronous_commit = off",
            ] {
                sqlx::query(setting).execute(&mut *tx).await?;
            }
        }
        // The working table has no index: each statement below reads it once, and the meters
        // and reservations are looked up by their own primary keys (an index here cost SQLite
        // 150 ms and PostgreSQL more, per 100,000 rows).
        for table in [
            "CREATE TEMP TABLE IF NOT EXISTS settling (
                id TEXT NOT NULL, tenant_id TEXT NOT NULL, account TEXT NOT NULL, node_id TEXT,
                block BIGINT NOT NULL, rate_now BIGINT NOT NULL, old_charged BIGINT NOT NULL,
                new_charged BIGINT NOT NULL, held BIGINT NOT NULL, bps BIGINT NOT NULL,
                end_at BIGINT NOT NULL, old_settled BIGINT NOT NULL)",
            "CREATE TEMP TABLE IF NOT EXISTS earning (
                node_id TEXT NOT NULL, account TEXT NOT NULL, amount BIGINT NOT NULL)",
            "CREATE TEMP TABLE IF NOT EXISTS short (account TEXT NOT NULL)",
            "CREATE TEMP TABLE IF NOT EXISTS per_account (
                account TEXT NOT NULL, tenant_id TEXT NOT NULL, block BIGINT NOT NULL,
                charged BIGINT NOT NULL, released BIGINT NOT NULL, need BIGINT NOT NULL)",
        ] {
            // PostgreSQL empties them at commit (a truncation, where a DELETE of last period's
            // 100,000 rows would leave them dead in a table no autovacuum visits), SQLite here.
            if self.backend == Backend::Postgres {
                sqlx::query(&format!("{table} ON COMMIT DELETE ROWS"))
                    .execute(&mut *tx)
                    .await?;
            } else {
                sqlx::query(table).execute(&mut *tx).await?;
            }
        }
        if self.backend == Backend::Sqlite {
            for table in ["settling", "earning", "short", "per_account"] {
                sqlx::query(&format!("DELETE FROM {table}"))
                    .execute(&mut *tx)
                    .await?;
            }
        }
        const COLUMNS: &str = "id, tenant_id, account, node_id, block, rate_now, old_charged,
            new_charged, held, bps, end_at, old_settled";
        // Meters before accounts. On PostgreSQL one pass over the meters computes, updates and
        // keeps what it updated (`PG_UPDATE`): a reservation that ended since it was read (its
        // meter closed: `settled_until` cleared) or was settled by another transaction is left
        // out (the update re-checks a row changed meanwhile), and left to `finish`. SQLite, which
        // has let no other writer in since this transaction began, computes first and updates
        // after.
        const SQLITE_UPDATE: &str = "UPDATE meters SET charged = s.new_charged, settled_until = s.end_at,
                held = CASE WHEN s.block = 1 THEN s.held - (s.new_charged - s.old_charged) ELSE 0 END
             FROM settling s
             WHERE meters.reservation_id = s.id AND meters.settled_until = s.old_settled";
        let count = if self.backend == Backend::Postgres {
            sqlx::query(&format!(
                "WITH u AS ({}) INSERT INTO settling ({COLUMNS}) SELECT {COLUMNS} FROM u",
                *PG_UPDATE
            ))
            .bind(at)
            .bind(cutoff)
            .execute(&mut *tx)
            .await?
            .rows_affected()
        } else {
            let count = sqlx::query(&format!("INSERT INTO settling ({COLUMNS}) {}", *DUE))
                .bind(at)
                .bind(cutoff)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if count > 0 {
                sqlx::query(SQLITE_UPDATE).execute(&mut *tx).await?;
            }
            count
        };
        if count == 0 {
            return Ok(Settled::default());
        }
        tracing::debug!(ms = clock.elapsed().as_millis(), "settlement: meters");
        // Each period's charge has its own id: one already recorded (the rows above were not
        // what they seemed) fails the insert, and the whole settlement with it.
        sqlx::query(
            "INSERT INTO transfers (id, debit_account, credit_account, amount, reservation_id,
                created_at, kind)
             SELECT 'charge:' || old_settled || ':' || id, account, $1, new_charged - old_charged,
                id, $2, 'charge'
             FROM settling WHERE new_charged > old_charged",
        )
        .bind(PLATFORM_REVENUE)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        // Host earnings, one transfer per node: the owner's share of each reservation's charges
        // so far, rounded down on the running total, minus what was paid before.
        sqlx::query(&format!(
            "INSERT INTO earning (node_id, account, amount)
             SELECT e.node_id, 'earnings:' || n.owner_id, e.amount
             FROM (SELECT node_id, CAST(SUM({} - {}) AS BIGINT) AS amount
                   FROM settling WHERE node_id IS NOT NULL GROUP BY node_id) e
             JOIN nodes n ON n.id = e.node_id
             WHERE e.amount > 0 AND n.owner_id IS NOT NULL",
            host_part_sql("new_charged", "bps"),
            host_part_sql("old_charged", "bps")
        ))
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO transfers (id, debit_account, credit_account, amount, created_at, kind,
                node_id)
             SELECT 'earn:' || node_id || ':' || $1, $2, account, amount, $1, 'earning', node_id
             FROM earning",
        )
        .bind(at)
        .bind(PLATFORM_REVENUE)
        .execute(&mut *tx)
        .await?;
        tracing::debug!(
            ms = clock.elapsed().as_millis(),
            "settlement: transfers inserted"
        );
        // What moved for each tenant account, from one pass over the working table: what it
        // was charged, the first-hour holds released to it, and what its next period needs.
        sqlx::query(
            "INSERT INTO per_account (account, tenant_id, block, charged, released, need)
             SELECT account, tenant_id, block, CAST(SUM(new_charged - old_charged) AS BIGINT),
                    CAST(SUM(CASE WHEN block = 0 THEN held ELSE 0 END) AS BIGINT),
                    CAST(SUM(CASE WHEN block = 0 THEN rate_now * $1 / 3600 ELSE 0 END) AS BIGINT)
             FROM settling GROUP BY account, tenant_id, block",
        )
        .bind(period_s)
        .execute(&mut *tx)
        .await?;
        // The first hour held at reservation goes back to the balance at the first settlement:
        // one transfer per tenant and period for all its reservations settled for the first
        // time (100,000 reservations started together are given back in one row, not 100,000).
        sqlx::query(
            "INSERT INTO transfers (id, debit_account, credit_account, amount, created_at, kind)
             SELECT 'release:' || $1 || ':' || tenant_id, 'hold:' || tenant_id,
                    'user:' || tenant_id, CAST(SUM(released) AS BIGINT), $1, 'release'
             FROM per_account WHERE block = 0 AND released > 0 GROUP BY tenant_id",
        )
        .bind(at)
        .execute(&mut *tx)
        .await?;
        // Every balance the transfers above moved, in one statement.
        sqlx::query(
            "UPDATE accounts SET balance = accounts.balance + m.delta
             FROM (SELECT account, CAST(SUM(delta) AS BIGINT) AS delta FROM (
                       SELECT account, -charged AS delta FROM per_account
                       UNION ALL
                       SELECT $1 AS account, charged AS delta FROM per_account
                       UNION ALL
                       SELECT 'hold:' || tenant_id, -released FROM per_account WHERE released > 0
                       UNION ALL
                       SELECT 'user:' || tenant_id, released FROM per_account WHERE released > 0
                       UNION ALL
                       SELECT account, amount FROM earning
                       UNION ALL
                       SELECT $1, -amount FROM earning) x
                   GROUP BY account) m
             WHERE accounts.id = m.account AND m.delta <> 0",
        )
        .bind(PLATFORM_REVENUE)
        .execute(&mut *tx)
        .await?;
        // Every account moved must exist (the transfers have no foreign keys on PostgreSQL).
        let missing: Option<String> = sqlx::query_scalar(
            "SELECT x.account FROM (SELECT account FROM per_account UNION SELECT 'hold:' || tenant_id
                                    FROM per_account UNION SELECT account FROM earning) x
             WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = x.account) LIMIT 1",
        )
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(account) = missing {
            return Err(StoreError::Corrupt(format!("no account {account:?}")));
        }
        tracing::debug!(ms = clock.elapsed().as_millis(), "settlement: charged");

        // Prepaid: a tenant whose balance cannot pay for the next period of its reservations
        // has them stopped now; billing stops with them. The accounts come first (usually none).
        let short = sqlx::query(
            "INSERT INTO short (account)
             SELECT a.id FROM accounts a JOIN per_account p ON p.account = a.id
             WHERE p.block = 0 AND a.balance < p.need",
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let mut nodes: Vec<String> = if short == 0 {
            Vec::new()
        } else {
            sqlx::query_scalar::<_, Option<String>>(
                "UPDATE reservations SET status = 'stopping', end_reason = 'insufficient_credit',
                    stop_requested_at = s.end_at
                 FROM settling s JOIN short ON short.account = s.account
                 WHERE reservations.id = s.id AND reservations.status = 'running' AND s.block = 0
                 RETURNING reservations.node_id",
            )
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .flatten()
            .collect()
        };
        if short > 0 {
            // Stopped: settled no more (see `stop_meter`).
            sqlx::query(
                "UPDATE meters SET settled_until = NULL
                 FROM settling s JOIN short ON short.account = s.account
                 WHERE meters.reservation_id = s.id AND s.block = 0",
            )
            .execute(&mut *tx)
            .await?;
        }
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
