//! Agent tunnels' holders in SQL.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{from_ts, ts, SqlStore};
use crate::{Result, TunnelHolder, TunnelStore};

#[async_trait]
impl TunnelStore for SqlStore {
    async fn hold_tunnel(
        &self,
        node_name: &str,
        replica_url: &str,
        relay_token: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO agent_tunnels (node_name, replica_url, relay_token, seen_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (node_name) DO UPDATE SET replica_url = excluded.replica_url,
                 relay_token = excluded.relay_token, seen_at = excluded.seen_at",
        )
        .bind(node_name)
        .bind(replica_url)
        .bind(relay_token)
        .bind(ts(now))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn release_tunnel(&self, node_name: &str, relay_token: &str) -> Result<()> {
        sqlx::query("DELETE FROM agent_tunnels WHERE node_name = $1 AND relay_token = $2")
            .bind(node_name)
            .bind(relay_token)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn tunnel_holder(
        &self,
        node_name: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<TunnelHolder>> {
        let row: Option<(String, String, i64)> = sqlx::query_as(
            "SELECT replica_url, relay_token, seen_at FROM agent_tunnels
             WHERE node_name = $1 AND seen_at >= $2",
        )
        .bind(node_name)
        .bind(ts(since))
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(replica_url, relay_token, seen_at)| {
            Ok(TunnelHolder {
                replica_url,
                relay_token,
                seen_at: from_ts(seen_at)?,
            })
        })
        .transpose()
    }
}
