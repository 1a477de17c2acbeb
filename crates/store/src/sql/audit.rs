//! The audit trail's records, head and signed checkpoints: appends chain each record to the
//! head in one transaction; reads page by position; pruning keeps whole checkpointed segments.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_audit::{Checkpoint, Entry, Record, Signer};
use sqlx::Row;

use super::{from_ts, multi_row, ts, SqlStore};
use crate::{AuditFilter, AuditStore, Result, StoreError};

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

async fn insert_checkpoint(
    conn: &mut sqlx::AnyConnection,
    c: &Checkpoint,
    anchor: bool,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit_checkpoints (seq, hash, at, signature, public_key, anchor)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(db_seq(c.seq))
    .bind(&c.hash)
    .bind(ts(c.at))
    .bind(&c.signature)
    .bind(&c.public_key)
    .bind(i64::from(anchor))
    .execute(&mut *conn)
    .await?;
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
        // Taking the head's row lock first serialises appends (several control planes).
        let head = sqlx::query(
            "UPDATE audit_head SET id = id WHERE id = 1
             RETURNING seq, hash, checkpoint_seq, checkpoint_at",
        )
        .fetch_one(&mut *tx)
        .await?;
        let mut seq = seq_of(head.try_get("seq")?);
        let mut hash: String = head.try_get("hash")?;
        let mut checkpoint_seq = seq_of(head.try_get("checkpoint_seq")?);
        let mut checkpoint_at: i64 = head.try_get("checkpoint_at")?;
        let records: Vec<Record> = entries
            .iter()
            .map(|e| {
                seq += 1;
                let r = Record::chain(seq, e.clone(), &hash);
                hash.clone_from(&r.hash);
                r
            })
            .collect();
        multi_row(
            &mut tx,
            records.len(),
            11,
            "INSERT INTO audit_log (seq, at, request_id, user_id, action, resource, allocation,
                outcome, client, prev_hash, hash) VALUES ",
            "",
            |i, q| {
                let r = &records[i];
                q.bind(db_seq(r.seq))
                    .bind(ts(r.entry.at))
                    .bind(r.entry.request_id.clone())
                    .bind(r.entry.user_id.clone())
                    .bind(r.entry.action.clone())
                    .bind(r.entry.resource.clone())
                    .bind(r.entry.allocation.clone())
                    .bind(i64::from(r.entry.outcome))
                    .bind(r.entry.client.clone())
                    .bind(r.prev_hash.clone())
                    .bind(r.hash.clone())
            },
        )
        .await?;
        let since = now.timestamp_micros().saturating_sub(checkpoint_at);
        let every = i64::try_from(policy.every.as_micros()).unwrap_or(i64::MAX);
        if seq > checkpoint_seq && (seq - checkpoint_seq >= policy.every_records || since >= every)
        {
            insert_checkpoint(&mut tx, &signer.sign(seq, &hash, now), false).await?;
            checkpoint_seq = seq;
            checkpoint_at = ts(now);
        }
        sqlx::query(
            "UPDATE audit_head SET seq = $1, hash = $2, checkpoint_seq = $3, checkpoint_at = $4
             WHERE id = 1",
        )
        .bind(db_seq(seq))
        .bind(&hash)
        .bind(db_seq(checkpoint_seq))
        .bind(checkpoint_at)
        .execute(&mut *tx)
        .await?;
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
