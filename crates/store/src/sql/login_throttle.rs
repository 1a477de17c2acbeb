//! Login throttling per account in SQL: the rule (`gpurent_types::login_throttle`) applied to
//! the account's row under its lock, so that every replica counts every try.

use chrono::{DateTime, Utc};
use gpurent_types::login_throttle::{self, Attempts, Verdict};
use sqlx::Row;

use super::{from_ts, ts, SqlStore};
use crate::Result;

pub(super) async fn attempt(
    store: &SqlStore,
    account: &str,
    user_id: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Verdict> {
    let mut tx = store.begin().await?;
    // The row exists before it is locked, so that two first tries at once both count: the
    // second waits for the first's insert and then for its lock.
    sqlx::query(
        "INSERT INTO login_throttle (account, user_id, failures, last_at, wait_until,
             window_start, window_tries)
         VALUES ($1, $2, 0, $3, NULL, $3, 0) ON CONFLICT (account) DO NOTHING",
    )
    .bind(account)
    .bind(user_id)
    .bind(ts(now))
    .execute(&mut *tx)
    .await?;
    // Locks the row on PostgreSQL (SQLite's transaction holds the write lock already).
    sqlx::query("UPDATE login_throttle SET failures = failures WHERE account = $1")
        .bind(account)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query(
        "SELECT failures, last_at, wait_until, window_start, window_tries
         FROM login_throttle WHERE account = $1",
    )
    .bind(account)
    .fetch_one(&mut *tx)
    .await?;
    let count = |col: &str| -> Result<u32> {
        Ok(u32::try_from(row.try_get::<i64, _>(col)?.max(0)).unwrap_or(u32::MAX))
    };
    let kept = Attempts {
        failures: count("failures")?,
        last_at: from_ts(row.try_get("last_at")?)?,
        wait_until: row
            .try_get::<Option<i64>, _>("wait_until")?
            .map(from_ts)
            .transpose()?,
        window_start: from_ts(row.try_get("window_start")?)?,
        window_tries: count("window_tries")?,
    };
    let decision = login_throttle::attempt(Some(kept), now);
    let next = decision.next;
    sqlx::query(
        "UPDATE login_throttle SET failures = $2, last_at = $3, wait_until = $4,
             window_start = $5, window_tries = $6
         WHERE account = $1",
    )
    .bind(account)
    .bind(i64::from(next.failures))
    .bind(ts(next.last_at))
    .bind(next.wait_until.map(ts))
    .bind(ts(next.window_start))
    .bind(i64::from(next.window_tries))
    .execute(&mut *tx)
    .await?;
    if let (true, Some(user_id)) = (decision.burst, user_id) {
        let detail = format!(
            "user {user_id}: {} failed logins within {} minutes; each further try waits up to {} minutes",
            login_throttle::BURST,
            login_throttle::BURST_WINDOW.num_minutes(),
            login_throttle::MAX_WAIT.num_minutes(),
        );
        sqlx::query("INSERT INTO events (at, node_id, kind, detail) VALUES ($1, NULL, $2, $3)")
            .bind(ts(now))
            .bind("login_burst")
            .bind(detail)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(decision.verdict)
}

pub(super) async fn succeeded(store: &SqlStore, account: &str) -> Result<()> {
    sqlx::query("DELETE FROM login_throttle WHERE account = $1")
        .bind(account)
        .execute(&store.pool)
        .await?;
    Ok(())
}

pub(super) async fn prune(
    store: &SqlStore,
    before: DateTime<Utc>,
    keep_unknown: u32,
) -> Result<u64> {
    let mut pruned = sqlx::query("DELETE FROM login_throttle WHERE last_at < $1")
        .bind(ts(before))
        .execute(&store.pool)
        .await?
        .rows_affected();
    // Names that are no user's: the newest `keep_unknown` only, so that a flood of made-up
    // names cannot grow the table without bound.
    pruned += sqlx::query(
        "DELETE FROM login_throttle WHERE user_id IS NULL AND account NOT IN (
             SELECT account FROM login_throttle WHERE user_id IS NULL
             ORDER BY last_at DESC LIMIT $1)",
    )
    .bind(i64::from(keep_unknown))
    .execute(&store.pool)
    .await?
    .rows_affected();
    Ok(pruned)
}
