//! Shared sealed keys in SQL: insert if absent, then read back what won.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{ts, SqlStore};
use crate::{Result, SharedKeyStore, StoreError};

#[async_trait]
impl SharedKeyStore for SqlStore {
    async fn shared_key(&self, name: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT sealed FROM shared_keys WHERE name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn insert_shared_key(
        &self,
        name: &str,
        sealed: &str,
        now: DateTime<Utc>,
    ) -> Result<String> {
        // Two statements, no transaction: the primary key decides which insert wins, and the
        // committed winner is what the read then sees on either database.
        sqlx::query(
            "INSERT INTO shared_keys (name, sealed, created_at) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(sealed)
        .bind(ts(now))
        .execute(&self.pool)
        .await?;
        self.shared_key(name)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("the shared key {name} vanished")))
    }
}
