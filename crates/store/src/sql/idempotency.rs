//! Idempotency keys: a POST's first answer, kept (sealed by the server) for its retries.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{ts, SqlStore};
use crate::{IdempotencyClaim, Result, StoreError};

/// HTTP status stored while the key's first request runs.
const IN_PROGRESS: i64 = 0;

impl SqlStore {
    pub(crate) async fn claim_key(
        &self,
        scope: &str,
        key_hash: &str,
        request_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<IdempotencyClaim> {
        // A row seen by the insert can be gone by the read (aborted or pruned in between): then
        // the key is free again and the insert is retried.
        for _ in 0..3 {
            let inserted = sqlx::query(
                "INSERT INTO idempotency_keys (scope, key_hash, request_hash, status, created_at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (scope, key_hash) DO NOTHING",
            )
            .bind(scope)
            .bind(key_hash)
            .bind(request_hash)
            .bind(IN_PROGRESS)
            .bind(ts(now))
            .execute(&self.pool)
            .await?
            .rows_affected();
            if inserted == 1 {
                return Ok(IdempotencyClaim::Fresh);
            }
            let row = sqlx::query(
                "SELECT request_hash, status, response FROM idempotency_keys
                 WHERE scope = $1 AND key_hash = $2",
            )
            .bind(scope)
            .bind(key_hash)
            .fetch_optional(&self.pool)
            .await?;
            let Some(row) = row else { continue };
            let stored_hash: String = row.try_get("request_hash")?;
            if stored_hash != request_hash {
                return Ok(IdempotencyClaim::Mismatch);
            }
            let status: i64 = row.try_get("status")?;
            if status == IN_PROGRESS {
                return Ok(IdempotencyClaim::InProgress);
            }
            let response: Option<String> = row.try_get("response")?;
            let corrupt = || {
                StoreError::Corrupt(format!(
                    "idempotency key in {scope:?}: status {status} without a valid response"
                ))
            };
            return Ok(IdempotencyClaim::Replay {
                status: u16::try_from(status).map_err(|_| corrupt())?,
                sealed_response: response.ok_or_else(corrupt)?,
            });
        }
        Ok(IdempotencyClaim::InProgress)
    }

    pub(crate) async fn finish_key(
        &self,
        scope: &str,
        key_hash: &str,
        status: u16,
        sealed_response: &str,
    ) -> Result<()> {
        let updated = sqlx::query(
            "UPDATE idempotency_keys SET status = $1, response = $2
             WHERE scope = $3 AND key_hash = $4 AND status = $5",
        )
        .bind(i64::from(status))
        .bind(sealed_response)
        .bind(scope)
        .bind(key_hash)
        .bind(IN_PROGRESS)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if updated == 0 {
            // Pruned while the request ran (a day late): its retries simply run again.
            tracing::warn!(
                scope,
                "idempotency key vanished before its answer was stored"
            );
        }
        Ok(())
    }

    pub(crate) async fn abort_key(&self, scope: &str, key_hash: &str) -> Result<()> {
        sqlx::query(
            "DELETE FROM idempotency_keys WHERE scope = $1 AND key_hash = $2 AND status = $3",
        )
        .bind(scope)
        .bind(key_hash)
        .bind(IN_PROGRESS)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(crate) async fn prune_keys(&self, before: DateTime<Utc>) -> Result<u64> {
        Ok(
            sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
                .bind(ts(before))
                .execute(&self.pool)
                .await?
                .rows_affected(),
        )
    }
}
