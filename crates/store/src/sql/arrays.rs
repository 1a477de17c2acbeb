//! Job arrays in SQL: the arrays, the index each starts next (moved at the value it read), and
//! their tasks counted. A task is a reservation with the array's id and its index.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::Reservation;
use gpurent_types::Money;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::batch::placeholders;
use super::rows::{reservation_from_row, scope_param, seen_tenants, RESERVATION_COLUMNS};
use super::{from_ts, new_id, ts, SqlStore};
use crate::arrays::{ArrayRow, ArrayStore, ArrayTasks, NewArray};
use crate::{Result, Scope, StoreError};

const COLUMNS: &str = "id, tenant_id, created_by, spec, secrets, first_index, last_index,
    max_running, next_index, message, retry_at, created_at, stopped_at, ended_at FROM arrays";

fn index(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn from_row(row: &AnyRow) -> Result<ArrayRow> {
    let opt_ts =
        |col: &str| -> Result<_> { row.try_get::<Option<i64>, _>(col)?.map(from_ts).transpose() };
    Ok(ArrayRow {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        created_by: row.try_get("created_by")?,
        spec: row.try_get("spec")?,
        sealed_secrets: row.try_get("secrets")?,
        first: index(row.try_get("first_index")?),
        last: index(row.try_get("last_index")?),
        max_running: row
            .try_get::<Option<i64>, _>("max_running")?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        next_index: index(row.try_get("next_index")?),
        message: row.try_get("message")?,
        retry_at: opt_ts("retry_at")?,
        created_at: from_ts(row.try_get("created_at")?)?,
        stopped_at: opt_ts("stopped_at")?,
        ended_at: opt_ts("ended_at")?,
    })
}

impl SqlStore {
    /// The array made under the key, if any; `IdempotencyMismatch` when it was another request.
    async fn array_by_key(&self, new: &NewArray, key: &str) -> Result<Option<ArrayRow>> {
        let Some(row) = sqlx::query(&format!(
            "SELECT request_hash, {COLUMNS} WHERE tenant_id = $1 AND idempotency_key = $2"
        ))
        .bind(&new.tenant_id)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        if row.try_get::<Option<String>, _>("request_hash")?.as_deref() != Some(&new.request_hash) {
            return Err(StoreError::IdempotencyMismatch);
        }
        from_row(&row).map(Some)
    }
}

#[async_trait]
impl ArrayStore for SqlStore {
    async fn create_array(&self, new: NewArray, now: DateTime<Utc>) -> Result<ArrayRow> {
        if let Some(key) = &new.idempotency_key {
            if let Some(first) = self.array_by_key(&new, key).await? {
                return Ok(first);
            }
        }
        let id = new_id();
        let inserted = sqlx::query(
            "INSERT INTO arrays (id, tenant_id, created_by, spec, secrets, idempotency_key,
                first_index, last_index, max_running, next_index, created_at, request_hash)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $7, $10, $11)",
        )
        .bind(&id)
        .bind(&new.tenant_id)
        .bind(&new.created_by)
        .bind(&new.spec)
        .bind(&new.sealed_secrets)
        .bind(&new.idempotency_key)
        .bind(big(new.first))
        .bind(big(new.last))
        .bind(new.max_running.map(i64::from))
        .bind(ts(now))
        .bind(&new.request_hash)
        .execute(&self.pool)
        .await
        .map_err(StoreError::from);
        match (inserted, &new.idempotency_key) {
            (Ok(_), _) => self.get_array(&id, &Scope::All).await,
            // The same key committed concurrently: that one is the array.
            (Err(e), Some(key)) if e.is_unique_violation() => {
                self.array_by_key(&new, key).await?.ok_or(e)
            }
            (Err(e), _) => Err(e),
        }
    }

    async fn get_array(&self, id: &str, scope: &Scope) -> Result<ArrayRow> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} WHERE id = $1 AND ($2 = '' OR tenant_id IN {})",
            seen_tenants(2)
        ))
        .bind(id)
        .bind(scope_param(scope))
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("array", id))?;
        from_row(&row)
    }

    async fn list_arrays(&self, scope: &Scope, limit: u32) -> Result<Vec<ArrayRow>> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} WHERE ($1 = '' OR tenant_id IN {})
             ORDER BY created_at DESC, id LIMIT $2",
            seen_tenants(1)
        ))
        .bind(scope_param(scope))
        .bind(i64::from(limit.min(1000)))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(from_row)
        .collect()
    }

    async fn live_arrays(&self) -> Result<Vec<ArrayRow>> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} WHERE ended_at IS NULL ORDER BY created_at, id"
        ))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(from_row)
        .collect()
    }

    async fn array_live_tasks(&self, ids: &[String]) -> Result<Vec<(String, u64)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // The partial index `reservations_array_live` holds exactly these rows.
        let sql = format!(
            "SELECT array_id, COUNT(*) AS n FROM reservations
             WHERE array_id IS NOT NULL AND status IN ('pending', 'starting', 'running', 'stopping')
               AND array_id IN ({}) GROUP BY array_id",
            placeholders(1, ids.len())
        );
        let mut query = sqlx::query(&sql);
        for id in ids {
            query = query.bind(id);
        }
        query
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((r.try_get("array_id")?, index(r.try_get("n")?))))
            .collect()
    }

    async fn array_tasks(&self, ids: &[String]) -> Result<Vec<(String, ArrayTasks)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT r.array_id,
                CAST(SUM(CASE WHEN r.status = 'stopped' AND r.end_reason = 'exited' THEN 1 ELSE 0 END) AS BIGINT) AS done,
                CAST(SUM(CASE WHEN r.status IN ('failed', 'preempted', 'lost') THEN 1 ELSE 0 END) AS BIGINT) AS failed,
                CAST(SUM(CASE WHEN r.status = 'expired' OR (r.status = 'stopped'
                    AND COALESCE(r.end_reason, '') <> 'exited') THEN 1 ELSE 0 END) AS BIGINT) AS stopped,
                CAST(SUM(CASE WHEN r.status IN ('starting', 'running', 'stopping')
                    OR (r.status = 'pending' AND r.node_id IS NOT NULL) THEN 1 ELSE 0 END) AS BIGINT) AS running,
                CAST(SUM(CASE WHEN r.status = 'pending' AND r.node_id IS NULL THEN 1 ELSE 0 END) AS BIGINT) AS queued,
                CAST(SUM(COALESCE(m.charged, 0)) AS BIGINT) AS charged, CAST(SUM(COALESCE(m.held, 0)) AS BIGINT) AS held,
                MIN(r.started_at) AS first_started, MAX(r.ended_at) AS last_ended
             FROM reservations r LEFT JOIN meters m ON m.reservation_id = r.id
             WHERE r.array_id IN ({}) GROUP BY r.array_id",
            placeholders(1, ids.len())
        );
        let mut query = sqlx::query(&sql);
        for id in ids {
            query = query.bind(id);
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                let n = |col: &str| -> Result<i64> {
                    Ok(r.try_get::<Option<i64>, _>(col)?.unwrap_or(0))
                };
                let opt_ts = |col: &str| -> Result<_> {
                    r.try_get::<Option<i64>, _>(col)?.map(from_ts).transpose()
                };
                Ok((
                    r.try_get("array_id")?,
                    ArrayTasks {
                        done: index(n("done")?),
                        failed: index(n("failed")?),
                        stopped: index(n("stopped")?),
                        running: index(n("running")?),
                        queued: index(n("queued")?),
                        charged: Money::from_micros(n("charged")?),
                        held: Money::from_micros(n("held")?),
                        first_started: opt_ts("first_started")?,
                        last_ended: opt_ts("last_ended")?,
                    },
                ))
            })
            .collect()
    }

    async fn advance_array(&self, id: &str, to: u64) -> Result<bool> {
        let done =
            sqlx::query("UPDATE arrays SET next_index = $2 WHERE id = $1 AND next_index < $2")
                .bind(id)
                .bind(big(to))
                .execute(&self.pool)
                .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn set_array_message(
        &self,
        id: &str,
        message: Option<&str>,
        retry_at: Option<DateTime<Utc>>,
    ) -> Result<()> {
        sqlx::query("UPDATE arrays SET message = $2, retry_at = $3 WHERE id = $1")
            .bind(id)
            .bind(message)
            .bind(retry_at.map(ts))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn stop_array(&self, id: &str, scope: &Scope, now: DateTime<Utc>) -> Result<ArrayRow> {
        let array = self.get_array(id, scope).await?;
        sqlx::query(
            "UPDATE arrays SET stopped_at = $2, message = NULL, retry_at = NULL
             WHERE id = $1 AND stopped_at IS NULL",
        )
        .bind(&array.id)
        .bind(ts(now))
        .execute(&self.pool)
        .await?;
        self.get_array(id, scope).await
    }

    async fn forget_array(&self, id: &str) -> Result<()> {
        sqlx::query(
            "DELETE FROM arrays WHERE id = $1 AND next_index = first_index
               AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.array_id = $1)",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn end_array(&self, id: &str, now: DateTime<Utc>) -> Result<()> {
        sqlx::query("UPDATE arrays SET ended_at = $2 WHERE id = $1 AND ended_at IS NULL")
            .bind(id)
            .bind(ts(now))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn array_task_id(&self, id: &str, index: u64, scope: &Scope) -> Result<String> {
        sqlx::query_scalar(&format!(
            "SELECT r.id FROM reservations r
             WHERE r.array_id = $1 AND r.array_index = $2 AND ($3 = '' OR r.tenant_id IN {})",
            seen_tenants(3)
        ))
        .bind(id)
        .bind(big(index))
        .bind(scope_param(scope))
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("array task", &format!("{id}[{index}]")))
    }

    async fn list_array_tasks(
        &self,
        id: &str,
        from: u64,
        limit: u32,
        live: bool,
    ) -> Result<Vec<Reservation>> {
        let live = if live {
            concat!(" AND r.status IN ", super::fragments::live_statuses!())
        } else {
            ""
        };
        sqlx::query(&format!(
            "SELECT {RESERVATION_COLUMNS} WHERE r.array_id = $1 AND r.array_index >= $2{live}
             ORDER BY r.array_index LIMIT $3"
        ))
        .bind(id)
        .bind(big(from))
        .bind(i64::from(limit.min(1000)))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(reservation_from_row)
        .collect()
    }
}
