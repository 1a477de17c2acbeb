//! Tenants' registry credentials in SQL.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::Registry;
use sqlx::Row;

use super::{from_ts, new_id, ts, SqlStore};
use crate::{NewRegistry, RegistryStore, Result, StoreError};

const COLUMNS: &str = "id, host, username, created_at FROM registries";

fn from_row(row: &sqlx::any::AnyRow) -> Result<Registry> {
    Ok(Registry {
        id: row.try_get("id")?,
        host: row.try_get("host")?,
        username: row.try_get("username")?,
        created_at: from_ts(row.try_get("created_at")?)?,
    })
}

#[async_trait]
impl RegistryStore for SqlStore {
    async fn add_registry(&self, new: NewRegistry, now: DateTime<Utc>) -> Result<Registry> {
        let row = sqlx::query(&format!(
            "INSERT INTO registries (id, owner_id, host, username, sealed_password, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (owner_id, host) DO UPDATE SET username = $4, sealed_password = $5,
                 created_at = $6
             RETURNING {}",
            COLUMNS.trim_end_matches(" FROM registries")
        ))
        .bind(new_id())
        .bind(&new.owner_id)
        .bind(&new.host)
        .bind(&new.username)
        .bind(&new.sealed_password)
        .bind(ts(now))
        .fetch_one(&self.pool)
        .await?;
        from_row(&row)
    }

    async fn list_registries(&self, owner_id: &str) -> Result<Vec<Registry>> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} WHERE owner_id = $1 ORDER BY host"
        ))
        .bind(owner_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(from_row)
        .collect()
    }

    async fn remove_registry(&self, owner_id: &str, host: &str) -> Result<Registry> {
        let row = sqlx::query(&format!(
            "DELETE FROM registries WHERE owner_id = $1 AND host = $2 RETURNING {}",
            COLUMNS.trim_end_matches(" FROM registries")
        ))
        .bind(owner_id)
        .bind(host)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("registry", host))?;
        from_row(&row)
    }

    async fn registry_secret(
        &self,
        owner_id: &str,
        host: &str,
    ) -> Result<Option<(String, String)>> {
        let row = sqlx::query(
            "SELECT username, sealed_password FROM registries WHERE owner_id = $1 AND host = $2",
        )
        .bind(owner_id)
        .bind(host)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| Ok((r.try_get("username")?, r.try_get("sealed_password")?)))
            .transpose()
    }
}
