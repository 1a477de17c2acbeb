//! The proxy's links and sessions in SQL.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{ts, SqlStore};
use crate::{ProxyGrant, ProxyStore, ProxyTokenKind, Result, StoreError};

fn grant(row: Option<(String, i64, String)>) -> Result<Option<ProxyGrant>> {
    row.map(|(reservation_id, port, user_id)| {
        Ok(ProxyGrant {
            reservation_id,
            port: u16::try_from(port)
                .map_err(|_| StoreError::Corrupt(format!("proxy port {port}")))?,
            user_id,
        })
    })
    .transpose()
}

#[async_trait]
impl ProxyStore for SqlStore {
    async fn add_proxy_token(
        &self,
        kind: ProxyTokenKind,
        token_hash: &str,
        grant: &ProxyGrant,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        // Expired tokens go as new ones come: the table holds only what can still be used.
        sqlx::query("DELETE FROM proxy_tokens WHERE expires_at < $1")
            .bind(ts(now))
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO proxy_tokens (token_hash, kind, reservation_id, port, user_id,
                 expires_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(token_hash)
        .bind(kind.as_str())
        .bind(&grant.reservation_id)
        .bind(i64::from(grant.port))
        .bind(&grant.user_id)
        .bind(ts(expires_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn peek_proxy_token(
        &self,
        kind: ProxyTokenKind,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<ProxyGrant>> {
        let row: Option<(String, i64, String)> = sqlx::query_as(
            "SELECT reservation_id, port, user_id FROM proxy_tokens
             WHERE token_hash = $1 AND kind = $2 AND used_at IS NULL AND expires_at > $3",
        )
        .bind(token_hash)
        .bind(kind.as_str())
        .bind(ts(now))
        .fetch_optional(&self.pool)
        .await?;
        grant(row)
    }

    async fn redeem_proxy_token(
        &self,
        kind: ProxyTokenKind,
        token_hash: &str,
        reservation_id: &str,
        port: u16,
        now: DateTime<Utc>,
    ) -> Result<Option<ProxyGrant>> {
        // One statement: of two replicas redeeming the same token at once, one gets it.
        let row: Option<(String, i64, String)> = sqlx::query_as(
            "UPDATE proxy_tokens SET used_at = $4
             WHERE token_hash = $1 AND kind = $5 AND reservation_id = $2 AND port = $3
                 AND used_at IS NULL AND expires_at > $4
             RETURNING reservation_id, port, user_id",
        )
        .bind(token_hash)
        .bind(reservation_id)
        .bind(i64::from(port))
        .bind(ts(now))
        .bind(kind.as_str())
        .fetch_optional(&self.pool)
        .await?;
        grant(row)
    }

    async fn proxy_session(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<ProxyGrant>> {
        let row: Option<(String, i64, String)> = sqlx::query_as(
            "SELECT reservation_id, port, user_id FROM proxy_tokens
             WHERE token_hash = $1 AND kind = 'session' AND expires_at > $2",
        )
        .bind(token_hash)
        .bind(ts(now))
        .fetch_optional(&self.pool)
        .await?;
        grant(row)
    }
}
