//! Endpoints in SQL: the endpoints, their keys and their replicas, and the scaler's standing
//! written at the revision it read.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{EndpointScaling, EndpointState};
use sqlx::Row;

use super::rows::{reservation_from_row, RESERVATION_COLUMNS};
use super::{from_ts, new_id, ts, SqlStore};
use crate::endpoints::{
    EndpointRow, EndpointSpec, EndpointStanding, EndpointStore, NewEndpoint, ReplicaRow,
};
use crate::{Result, StoreError};

const COLUMNS: &str = "id, name, tenant_id, spec, scaling, generation, state, message, failures,
    retry_at, revision, created_at FROM endpoints";

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("endpoint: {e}"))
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(corrupt)
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn from_row(row: &sqlx::any::AnyRow) -> Result<EndpointRow> {
    let spec: String = row.try_get("spec")?;
    let scaling: String = row.try_get("scaling")?;
    let state: String = row.try_get("state")?;
    Ok(EndpointRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        tenant_id: row.try_get("tenant_id")?,
        spec: serde_json::from_str(&spec).map_err(corrupt)?,
        scaling: serde_json::from_str(&scaling).map_err(corrupt)?,
        generation: count(row.try_get("generation")?),
        state: EndpointState::parse(&state).ok_or_else(|| corrupt(&state))?,
        message: row.try_get("message")?,
        failures: u32::try_from(row.try_get::<i64, _>("failures")?).unwrap_or(u32::MAX),
        retry_at: row
            .try_get::<Option<i64>, _>("retry_at")?
            .map(from_ts)
            .transpose()?,
        revision: row.try_get("revision")?,
        created_at: from_ts(row.try_get("created_at")?)?,
    })
}

impl SqlStore {
    async fn endpoint_by_id(&self, id: &str) -> Result<EndpointRow> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("endpoint", id))?;
        from_row(&row)
    }
}

#[async_trait]
impl EndpointStore for SqlStore {
    async fn create_endpoint(&self, new: NewEndpoint, now: DateTime<Utc>) -> Result<EndpointRow> {
        let id = new_id();
        sqlx::query(
            "INSERT INTO endpoints (id, name, tenant_id, spec, scaling, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(&new.name)
        .bind(&new.tenant_id)
        .bind(to_json(&new.spec)?)
        .bind(to_json(&new.scaling)?)
        .bind(ts(now))
        .execute(&self.pool)
        .await
        .map_err(StoreError::from)
        .map_err(|e| {
            if e.is_unique_violation() {
                StoreError::Duplicate(format!("name: there is an endpoint named {:?}", new.name))
            } else {
                e
            }
        })?;
        self.endpoint_by_id(&id).await
    }

    async fn endpoint_by_name(&self, name: &str) -> Result<EndpointRow> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} WHERE name = $1 AND deleted_at IS NULL"
        ))
        .bind(name)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("endpoint", name))?;
        from_row(&row)
    }

    async fn list_endpoints(&self, tenant: Option<&str>) -> Result<Vec<EndpointRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} WHERE deleted_at IS NULL AND ($1 IS NULL OR tenant_id = $1)
             ORDER BY name"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }

    async fn update_endpoint(
        &self,
        id: &str,
        spec: &EndpointSpec,
        scaling: &EndpointScaling,
        new_generation: bool,
    ) -> Result<EndpointRow> {
        let bump = i64::from(new_generation);
        let updated = sqlx::query(
            "UPDATE endpoints SET spec = $2, scaling = $3, generation = generation + $4,
                revision = revision + 1,
                failures = CASE WHEN $4 = 1 THEN 0 ELSE failures END,
                retry_at = CASE WHEN $4 = 1 THEN NULL ELSE retry_at END
             WHERE id = $1 AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(to_json(spec)?)
        .bind(to_json(scaling)?)
        .bind(bump)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if updated == 0 {
            return Err(StoreError::not_found("endpoint", id));
        }
        self.endpoint_by_id(id).await
    }

    async fn delete_endpoint(&self, id: &str, now: DateTime<Utc>) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for table in ["endpoint_keys", "endpoint_load"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE endpoint_id = $1"))
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        let updated = sqlx::query(
            "UPDATE endpoints SET deleted_at = $2, revision = revision + 1
             WHERE id = $1 AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(ts(now))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if updated == 0 {
            return Err(StoreError::not_found("endpoint", id));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn set_endpoint_standing(&self, id: &str, s: &EndpointStanding) -> Result<bool> {
        let updated = sqlx::query(
            "UPDATE endpoints SET state = $3, message = $4, failures = $5, retry_at = $6,
                revision = revision + 1
             WHERE id = $1 AND revision = $2 AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(s.revision)
        .bind(s.state.as_str())
        .bind(&s.message)
        .bind(i64::from(s.failures))
        .bind(s.retry_at.map(ts))
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(updated == 1)
    }

    async fn endpoint_replicas(
        &self,
        ids: &[String],
        ended_since: Option<DateTime<Utc>>,
    ) -> Result<Vec<ReplicaRow>> {
        let filter = if ids.is_empty() {
            "r.endpoint_id IS NOT NULL".to_owned()
        } else {
            format!("r.endpoint_id IN ({})", placeholders(2, ids.len()))
        };
        let sql = format!(
            "SELECT r.endpoint_id, r.endpoint_gen, {RESERVATION_COLUMNS}
             WHERE {filter} AND (r.status IN {} OR r.ended_at >= $1)
             ORDER BY r.endpoint_id, r.endpoint_replica",
            super::fragments::live_statuses!()
        );
        let mut query = sqlx::query(&sql).bind(ended_since.map_or(i64::MAX, ts));
        for id in ids {
            query = query.bind(id);
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let reservation = reservation_from_row(row)?;
                Ok(ReplicaRow {
                    endpoint_id: row.try_get("endpoint_id")?,
                    index: reservation.endpoint_replica.unwrap_or(0),
                    generation: count(row.try_get::<Option<i64>, _>("endpoint_gen")?.unwrap_or(0)),
                    reservation,
                })
            })
            .collect()
    }

    async fn last_replica_index(&self, id: &str) -> Result<u64> {
        let last: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(endpoint_replica) FROM reservations WHERE endpoint_id = $1",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await?;
        Ok(last.map_or(0, count))
    }

    async fn add_endpoint_key(
        &self,
        endpoint_id: &str,
        key_id: &str,
        key_hash: &str,
        prefix: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO endpoint_keys (id, endpoint_id, key_hash, prefix, created_at)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(key_id)
        .bind(endpoint_id)
        .bind(key_hash)
        .bind(prefix)
        .bind(ts(now))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn endpoint_keys(
        &self,
        endpoint_id: &str,
    ) -> Result<Vec<(String, String, DateTime<Utc>)>> {
        let rows = sqlx::query(
            "SELECT id, prefix, created_at FROM endpoint_keys WHERE endpoint_id = $1
             ORDER BY created_at, id",
        )
        .bind(endpoint_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("id")?,
                    r.try_get("prefix")?,
                    from_ts(r.try_get("created_at")?)?,
                ))
            })
            .collect()
    }

    async fn remove_endpoint_key(&self, endpoint_id: &str, key_id: &str) -> Result<()> {
        let removed = sqlx::query("DELETE FROM endpoint_keys WHERE endpoint_id = $1 AND id = $2")
            .bind(endpoint_id)
            .bind(key_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if removed == 0 {
            return Err(StoreError::not_found("key", key_id));
        }
        Ok(())
    }

    async fn lease_endpoint(
        &self,
        id: &str,
        server: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool> {
        let taken = sqlx::query(
            "UPDATE endpoints SET leader = $2, lease_until = $4
             WHERE id = $1 AND deleted_at IS NULL
               AND (leader = $2 OR leader IS NULL OR lease_until IS NULL OR lease_until < $3)",
        )
        .bind(id)
        .bind(server)
        .bind(ts(now))
        .bind(ts(until))
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(taken == 1)
    }

    async fn put_endpoint_loads(
        &self,
        server: &str,
        loads: &[(String, u32, u32)],
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for (endpoint, inflight, queued) in loads {
            sqlx::query(
                "INSERT INTO endpoint_load (endpoint_id, server_id, inflight, queued, at)
                 SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM endpoints WHERE id = $1)
                 ON CONFLICT (endpoint_id, server_id) DO UPDATE SET inflight = excluded.inflight,
                    queued = excluded.queued, at = excluded.at",
            )
            .bind(endpoint)
            .bind(server)
            .bind(i64::from(*inflight))
            .bind(i64::from(*queued))
            .bind(ts(now))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn endpoint_loads(
        &self,
        except_server: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<(String, u32, u32)>> {
        let rows = sqlx::query(
            "SELECT endpoint_id, CAST(SUM(inflight) AS BIGINT) AS inflight,
                CAST(SUM(queued) AS BIGINT) AS queued
             FROM endpoint_load WHERE server_id <> $1 AND at >= $2 GROUP BY endpoint_id",
        )
        .bind(except_server)
        .bind(ts(since))
        .fetch_all(&self.pool)
        .await?;
        let n = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("endpoint_id")?,
                    n(r.try_get("inflight")?),
                    n(r.try_get("queued")?),
                ))
            })
            .collect()
    }

    async fn endpoint_of_key(&self, key_hash: &str) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "SELECT k.endpoint_id FROM endpoint_keys k JOIN endpoints e ON e.id = k.endpoint_id
             WHERE k.key_hash = $1 AND e.deleted_at IS NULL",
        )
        .bind(key_hash)
        .fetch_optional(&self.pool)
        .await?)
    }
}

/// `$from, $from+1, ...`: `n` placeholders.
fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}
