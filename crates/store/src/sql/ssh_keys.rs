//! Users' SSH public keys in SQL.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::SshKey;
use sqlx::Row;

use super::{from_ts, new_id, ts, SqlStore};
use crate::{NewSshKey, Result, SshKeyStore, StoreError};

const KEY_COLUMNS: &str =
    "id, user_id, name, algorithm, fingerprint, public_key, created_at FROM ssh_keys";

fn key_from_row(row: &sqlx::any::AnyRow) -> Result<SshKey> {
    Ok(SshKey {
        id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        name: row.try_get("name")?,
        algorithm: row.try_get("algorithm")?,
        fingerprint: row.try_get("fingerprint")?,
        public_key: row.try_get("public_key")?,
        created_at: from_ts(row.try_get("created_at")?)?,
    })
}

#[async_trait]
impl SshKeyStore for SqlStore {
    async fn add_ssh_key(&self, new: NewSshKey, now: DateTime<Utc>) -> Result<SshKey> {
        let id = new_id();
        let inserted = sqlx::query(
            "INSERT INTO ssh_keys (id, user_id, name, algorithm, fingerprint, public_key, created_at)
             SELECT $1, u.id, $3, $4, $5, $6, $7 FROM users u WHERE u.id = $2",
        )
        .bind(&id)
        .bind(&new.user_id)
        .bind(&new.name)
        .bind(&new.algorithm)
        .bind(&new.fingerprint)
        .bind(&new.public_key)
        .bind(ts(now))
        .execute(&self.pool)
        .await
        .map_err(StoreError::from)
        .map_err(|e| {
            if e.is_unique_violation() {
                StoreError::Duplicate(format!(
                    "public_key: this key ({}) is added already",
                    new.fingerprint
                ))
            } else {
                e
            }
        })?
        .rows_affected();
        if inserted == 0 {
            return Err(StoreError::not_found("user", &new.user_id));
        }
        Ok(SshKey {
            id,
            user_id: new.user_id,
            name: new.name,
            algorithm: new.algorithm,
            fingerprint: new.fingerprint,
            public_key: new.public_key,
            created_at: from_ts(ts(now))?,
        })
    }

    async fn list_ssh_keys(
        &self,
        user_id: Option<&str>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Vec<SshKey>> {
        sqlx::query(&super::users_page_sql(KEY_COLUMNS, "ssh_keys"))
            .bind(user_id.unwrap_or(""))
            .bind(after.unwrap_or(""))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(key_from_row)
            .collect()
    }

    async fn remove_ssh_key(&self, id: &str, user_id: Option<&str>) -> Result<SshKey> {
        let row = sqlx::query(&format!(
            "DELETE FROM ssh_keys WHERE id = $1 AND ($2 = '' OR user_id = $2)
             RETURNING {}",
            KEY_COLUMNS.trim_end_matches(" FROM ssh_keys")
        ))
        .bind(id)
        .bind(user_id.unwrap_or(""))
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("ssh key", id))?;
        key_from_row(&row)
    }

    async fn ssh_key_by_fingerprint(
        &self,
        user_id: &str,
        fingerprint: &str,
    ) -> Result<Option<SshKey>> {
        sqlx::query(&format!(
            "SELECT {KEY_COLUMNS} WHERE user_id = $1 AND fingerprint = $2"
        ))
        .bind(user_id)
        .bind(fingerprint)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(key_from_row)
        .transpose()
    }
}
