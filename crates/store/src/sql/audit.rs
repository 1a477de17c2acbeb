//! The audit trail's records, head and signed checkpoints: appends chain each record to the
//! head in one transaction; reads page by position; pruning keeps whole checkpointed segments.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_audit::{Checkpoint, Entry, Record, Signer};
use sqlx::Row;

use super::batch::{Answers, Arg, Batch};
use super::{from_ts, ts, SqlStore};
use crate::{AuditFilter, AuditStore, Backend, Result, StoreError};

/// When a checkpoint is signed: after this many records, or this long after the last one.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointPolicy {
    pub every_records: u64,
    pub every: Duration,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every_records: 1000,
            every: Duration::from_secs(60),
        }
    }
}

fn seq_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn db_seq(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn record_from_row(row: &sqlx::any::AnyRow) -> Result<Record> {
    let outcome: i64 = row.try_get("outcome")?;
    Ok(Record {
        seq: seq_of(row.try_get("seq")?),
        entry: Entry {
            request_id: row.try_get("request_id")?,
            at: from_ts(row.try_get("at")?)?,
            user_id: row.try_get("user_id")?,
            action: row.try_get("action")?,
            resource: row.try_get("resource")?,
            allocation: row.try_get("allocation")?,
            outcome: u16::try_from(outcome).map_err(|_| {
                StoreError::Corrupt(format!("audit outcome {outcome} is not an HTTP status"))
            })?,
            client: row.try_get("client")?,
        },
        prev_hash: row.try_get("prev_hash")?,
        hash: row.try_get("hash")?,
    })
}

fn checkpoint_from_row(row: &sqlx::any::AnyRow) -> Result<Checkpoint> {
    Ok(Checkpoint {
        seq: seq_of(row.try_get("seq")?),
        hash: row.try_get("hash")?,
        at: from_ts(row.try_get("at")?)?,
        signature: row.try_get("signature")?,
        public_key: row.try_get("public_key")?,
    })
}

/// The trail's head, read under its row lock: the lock serialises appends (several control
/// planes; on SQLite the write lock of `BEGIN IMMEDIATE` already does).
pub(super) const HEAD: &str = "UPDATE audit_head SET id = id WHERE id = 1
     RETURNING seq, hash, checkpoint_seq, checkpoint_at";

/// The head as [`HEAD`] read it.
pub(super) struct Head {
    seq: u64,
    hash: String,
    checkpoint_seq: u64,
    checkpoint_at: i64,
}

/// The columns [`HEAD`] returns.
pub(super) const HEAD_COLUMNS: &[&str] = &["seq", "hash", "checkpoint_seq", "checkpoint_at"];

impl Head {
    /// The head as part `part` of `answers` read it.
    pub(super) fn of(answers: &Answers, part: usize) -> Result<Head> {
        Head::in_row(answers.rows(part).first(), "")
    }

    /// The head as a statement's part `part` returned it beside its rows
    /// (`Batch::run_as_one` with [`HEAD_COLUMNS`]).
    pub(super) fn beside(answers: &Answers, rows_of: usize, part: usize) -> Result<Head> {
        Head::in_row(answers.rows(rows_of).first(), &format!("p{part}_"))
    }

    /// The head in `row`, its columns named with `prefix`.
    fn in_row(row: Option<&sqlx::any::AnyRow>, prefix: &str) -> Result<Head> {
        let row =
            row.ok_or_else(|| StoreError::Corrupt("the audit trail has no head row".to_owned()))?;
        let column = |c: &str| format!("{prefix}{c}");
        // Beside other rows, a missing head comes back as NULLs.
        let hash: String = row
            .try_get::<Option<String>, _>(column("hash").as_str())?
            .ok_or_else(|| StoreError::Corrupt("the audit trail has no head row".to_owned()))?;
        Ok(Head {
            seq: seq_of(row.try_get(column("seq").as_str())?),
            hash,
            checkpoint_seq: seq_of(row.try_get(column("checkpoint_seq").as_str())?),
            checkpoint_at: row.try_get(column("checkpoint_at").as_str())?,
        })
    }
}

/// The columns of one record.
const WIDTH: usize = 11;

/// Pushes `entries` chained after `head`: their rows, a checkpoint of the new head signed when
/// `policy` says one is due, and the new head (its part returns its `seq`). Returns the new
/// head's position and the head's part.
pub(super) fn push_chain(
    batch: &mut Batch,
    head: Head,
    entries: impl IntoIterator<Item = Entry>,
    signer: &Signer,
    policy: CheckpointPolicy,
    now: DateTime<Utc>,
) -> (u64, usize) {
    let Head {
        mut seq,
        mut hash,
        mut checkpoint_seq,
        mut checkpoint_at,
    } = head;
    let records: Vec<Record> = entries
        .into_iter()
        .map(|e| {
            seq += 1;
            let r = Record::chain(seq, e, &hash);
            hash.clone_from(&r.hash);
            r
        })
        .collect();
    for chunk in records.chunks(super::ROWS_PER_STATEMENT) {
        let mut sql = String::from(
            "INSERT INTO audit_log (seq, at, request_id, user_id, action, resource, allocation,
                outcome, client, prev_hash, hash) VALUES ",
        );
        let mut args = Vec::with_capacity(chunk.len() * WIDTH);
        for (n, r) in chunk.iter().enumerate() {
            sql.push_str(if n == 0 { "(" } else { ", (" });
            let params: Vec<String> = (1..=WIDTH).map(|c| format!("${}", n * WIDTH + c)).collect();
            sql.push_str(&params.join(", "));
            sql.push(')');
            args.extend([
                Arg::from(db_seq(r.seq)),
                Arg::from(ts(r.entry.at)),
                Arg::from(&r.entry.request_id),
                Arg::from(&r.entry.user_id),
                Arg::from(&r.entry.action),
                Arg::from(&r.entry.resource),
                Arg::from(&r.entry.allocation),
                Arg::from(i64::from(r.entry.outcome)),
                Arg::from(&r.entry.client),
                Arg::from(&r.prev_hash),
                Arg::from(&r.hash),
            ]);
        }
        batch.push(sql, args);
    }
    let since = now.timestamp_micros().saturating_sub(checkpoint_at);
    let every = i64::try_from(policy.every.as_micros()).unwrap_or(i64::MAX);
    if seq > checkpoint_seq && (seq - checkpoint_seq >= policy.every_records || since >= every) {
        let c = signer.sign(seq, &hash, now);
        batch.push(
            "INSERT INTO audit_checkpoints (seq, hash, at, signature, public_key, anchor)
             VALUES ($1, $2, $3, $4, $5, 0)",
            vec![
                Arg::from(db_seq(c.seq)),
                Arg::from(c.hash),
                Arg::from(ts(c.at)),
                Arg::from(c.signature),
                Arg::from(c.public_key),
            ],
        );
        checkpoint_seq = seq;
        checkpoint_at = ts(now);
    }
    let part = batch.push(
        "UPDATE audit_head SET seq = $1, hash = $2, checkpoint_seq = $3, checkpoint_at = $4
         WHERE id = 1 RETURNING seq",
        vec![
            Arg::from(db_seq(seq)),
            Arg::from(hash),
            Arg::from(db_seq(checkpoint_seq)),
            Arg::from(checkpoint_at),
        ],
    );
    (seq, part)
}

/// Runs what [`push_chain`] pushed: on PostgreSQL as one statement.
pub(super) async fn run_chain(
    conn: &mut sqlx::AnyConnection,
    backend: Backend,
    batch: Batch,
    head_part: usize,
) -> Result<()> {
    let answers = match backend {
        Backend::Postgres => batch.run_as_one(conn, head_part, None).await?,
        Backend::Sqlite => batch.run(conn, backend).await?,
    };
    if answers.affected(head_part) != 1 {
        return Err(StoreError::Corrupt(
            "the audit trail's head was not moved".to_owned(),
        ));
    }
    Ok(())
}

#[async_trait]
impl AuditStore for SqlStore {
    async fn append_audit(
        &self,
        entries: &[Entry],
        signer: &Signer,
        policy: CheckpointPolicy,
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let mut tx = self.begin().await?;
        let mut read = Batch::default();
        let part = read.push(HEAD, Vec::new());
        let head = Head::of(&read.run(&mut tx, self.backend).await?, part)?;
        let mut batch = Batch::default();
        let (seq, part) = push_chain(
            &mut batch,
            head,
            entries.iter().cloned(),
            signer,
            policy,
            now,
        );
        run_chain(&mut tx, self.backend, batch, part).await?;
        tx.commit().await?;
        Ok(seq)
    }

    async fn audit_records(
        &self,
        filter: &AuditFilter,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<Record>> {
        const COLUMNS: &str = "seq, at, request_id, user_id, action, resource, allocation,
            outcome, client, prev_hash, hash";
        let everything = filter.user_id.is_none()
            && filter.resource.is_none()
            && filter.from.is_none()
            && filter.to.is_none();
        let rows = if everything {
            // Verification and export read the whole trail in order: the plainest plan.
            sqlx::query(&format!(
                "SELECT {COLUMNS} FROM audit_log WHERE seq > $1 ORDER BY seq LIMIT $2"
            ))
            .bind(db_seq(after_seq))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?
        } else {
            let resource = filter.resource.clone().unwrap_or_default();
            sqlx::query(&format!(
                "SELECT {COLUMNS} FROM audit_log
                 WHERE seq > $1
                   AND ($2 = '' OR user_id = $2)
                   AND ($3 = '' OR resource = $3 OR resource LIKE $4 OR allocation LIKE $4)
                   AND at >= $5 AND at < $6
                 ORDER BY seq LIMIT $7"
            ))
            .bind(db_seq(after_seq))
            .bind(filter.user_id.clone().unwrap_or_default())
            .bind(resource.clone())
            .bind(format!("%{resource}%"))
            .bind(filter.from.map_or(i64::MIN, ts))
            .bind(filter.to.map_or(i64::MAX, ts))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?
        };
        rows.iter().map(record_from_row).collect()
    }

    async fn audit_checkpoints(&self) -> Result<Vec<Checkpoint>> {
        let rows = sqlx::query(
            "SELECT seq, hash, at, signature, public_key FROM audit_checkpoints
             WHERE anchor = 0 ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(checkpoint_from_row).collect()
    }

    async fn audit_anchor(&self) -> Result<Option<Checkpoint>> {
        let row = sqlx::query(
            "SELECT seq, hash, at, signature, public_key FROM audit_checkpoints
             WHERE anchor <> 0 ORDER BY seq DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(checkpoint_from_row).transpose()
    }

    async fn audit_head(&self) -> Result<(u64, String)> {
        let row = sqlx::query("SELECT seq, hash FROM audit_head WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        Ok((seq_of(row.try_get("seq")?), row.try_get("hash")?))
    }

    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut tx = self.begin().await?;
        // The last checkpoint before the first record that is not older than `before`: the
        // records up to it form whole checkpointed segments, all old enough.
        let first_young: Option<i64> =
            sqlx::query_scalar("SELECT MIN(seq) FROM audit_log WHERE at >= $1")
                .bind(ts(before))
                .fetch_one(&mut *tx)
                .await?;
        let anchor = sqlx::query(
            "SELECT seq FROM audit_checkpoints WHERE anchor = 0 AND seq < $1
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(first_young.unwrap_or(i64::MAX))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(anchor) = anchor else {
            tx.commit().await?;
            return Ok(0);
        };
        let anchor: i64 = anchor.try_get("seq")?;
        let pruned = sqlx::query("DELETE FROM audit_log WHERE seq <= $1")
            .bind(anchor)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM audit_checkpoints WHERE seq < $1")
            .bind(anchor)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE audit_checkpoints SET anchor = 1 WHERE seq = $1")
            .bind(anchor)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(pruned)
    }
}
