//! Tokens with expiry and revocation, passwords and per-user cap overrides in SQL.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{Token, User};
use gpurent_types::login_throttle::Verdict;
use gpurent_types::{Money, TokenScope};
use sqlx::Row;

use super::{from_ts, new_id, ts, SqlStore};
use crate::{
    AccessStore, AuthUser, LoginFacts, NewToken, Result, StoreError, TokenCheck, TokenFacts,
};

const TOKEN_COLUMNS: &str =
    "id, user_id, kind, name, created_at, expires_at, revoked_at, scopes, team_id FROM api_tokens";

/// Scopes as kept: a comma-separated list; NULL for none given (everything).
pub(crate) fn scopes_to_text(scopes: Option<&[TokenScope]>) -> Option<String> {
    scopes.map(|s| s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","))
}

fn scopes_of(text: Option<String>) -> Result<Option<Vec<TokenScope>>> {
    text.map(|t| {
        t.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse()
                    .map_err(|e| StoreError::Corrupt(format!("api_tokens.scopes: {e}")))
            })
            .collect()
    })
    .transpose()
}

fn token_from_row(row: &sqlx::any::AnyRow) -> Result<Token> {
    let opt = |col: &str| -> Result<Option<DateTime<Utc>>> {
        row.try_get::<Option<i64>, _>(col)?.map(from_ts).transpose()
    };
    Ok(Token {
        id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        kind: row.try_get("kind")?,
        name: row.try_get("name")?,
        created_at: from_ts(row.try_get("created_at")?)?,
        expires_at: opt("expires_at")?,
        revoked_at: opt("revoked_at")?,
        scopes: scopes_of(row.try_get("scopes")?)?,
        team_id: row.try_get("team_id")?,
    })
}

#[async_trait]
impl AccessStore for SqlStore {
    async fn check_token(&self, token_hash: &str, now: DateTime<Utc>) -> Result<TokenCheck> {
        let unexpired =
            |(_, token): &(AuthUser, TokenFacts)| token.expires_at.is_none_or(|at| now < at);
        let generation = match self.tokens.get(token_hash, unexpired) {
            Ok((user, token)) => return Ok(TokenCheck::Valid(user, token)),
            Err(generation) => generation,
        };
        let read_at = std::time::Instant::now();
        let row = sqlx::query(
            "SELECT u.id, u.name, u.role, t.id AS token_id, t.kind, t.created_at, t.expires_at,
                t.revoked_at, t.scopes, t.team_id
             FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE t.token_hash = $1",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(TokenCheck::Unknown);
        };
        if let Some(at) = row.try_get::<Option<i64>, _>("revoked_at")? {
            return Ok(TokenCheck::Revoked(from_ts(at)?));
        }
        let expires_at = row.try_get::<Option<i64>, _>("expires_at")?;
        if let Some(at) = expires_at {
            if at <= ts(now) {
                return Ok(TokenCheck::Expired(from_ts(at)?));
            }
        }
        let role: String = row.try_get("role")?;
        let user = AuthUser {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            role: role
                .parse()
                .map_err(|e| StoreError::Corrupt(format!("{e}")))?,
        };
        let kind: String = row.try_get("kind")?;
        let token = TokenFacts {
            id: row.try_get("token_id")?,
            expires_at: expires_at.map(from_ts).transpose()?,
            login_at: if kind == "session" {
                Some(from_ts(row.try_get("created_at")?)?)
            } else {
                None
            },
            scopes: scopes_of(row.try_get("scopes")?)?,
            team_id: row.try_get("team_id")?,
        };
        self.tokens.put(
            token_hash,
            generation,
            read_at,
            (user.clone(), token.clone()),
        );
        Ok(TokenCheck::Valid(user, token))
    }

    async fn create_token(&self, new: NewToken, now: DateTime<Utc>) -> Result<Token> {
        let id = new_id();
        let inserted = sqlx::query(
            "INSERT INTO api_tokens (token_hash, user_id, created_at, id, kind, name, expires_at,
                parent_id, scopes, team_id)
             SELECT $1, u.id, $3, $4, $5, $6, $7, $8, $9, $10 FROM users u WHERE u.id = $2",
        )
        .bind(&new.token_hash)
        .bind(&new.user_id)
        .bind(ts(now))
        .bind(&id)
        .bind(new.kind)
        .bind(&new.name)
        .bind(new.expires_at.map(ts))
        .bind(&new.parent_id)
        .bind(scopes_to_text(new.scopes.as_deref()))
        .bind(&new.team_id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if inserted == 0 {
            return Err(StoreError::not_found("user", &new.user_id));
        }
        Ok(Token {
            id,
            user_id: new.user_id,
            kind: new.kind.to_owned(),
            name: new.name,
            created_at: from_ts(ts(now))?,
            expires_at: new.expires_at.map(ts).map(from_ts).transpose()?,
            revoked_at: None,
            scopes: new.scopes,
            team_id: new.team_id,
        })
    }

    async fn list_tokens(
        &self,
        user_id: Option<&str>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Vec<Token>> {
        sqlx::query(&super::users_page_sql(TOKEN_COLUMNS, "api_tokens"))
            .bind(user_id.unwrap_or(""))
            .bind(after.unwrap_or(""))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(token_from_row)
            .collect()
    }

    async fn revoke_token(
        &self,
        id: &str,
        user_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Token> {
        let mut tx = self.begin().await?;
        // The token and its descendants: children are made by their parent's owner, so the
        // owner check on the first is the check on all.
        sqlx::query(
            "WITH RECURSIVE lineage (id) AS (
                 SELECT id FROM api_tokens WHERE id = $1 AND ($2 = '' OR user_id = $2)
                 UNION SELECT t.id FROM api_tokens t JOIN lineage l ON t.parent_id = l.id
             )
             UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, $3)
             WHERE id IN (SELECT id FROM lineage)",
        )
        .bind(id)
        .bind(user_id.unwrap_or(""))
        .bind(ts(now))
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query(&format!(
            "SELECT {TOKEN_COLUMNS} WHERE id = $1 AND ($2 = '' OR user_id = $2)"
        ))
        .bind(id)
        .bind(user_id.unwrap_or(""))
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::not_found("token", id))?;
        let token = token_from_row(&row)?;
        tx.commit().await?;
        // After the commit: a check that reads before it may still cache the old answer,
        // and this clears it; one that reads after it sees the revocation.
        self.tokens.clear();
        Ok(token)
    }

    async fn prune_tokens(&self, before: DateTime<Utc>) -> Result<u64> {
        // Two statements, so that each uses its partial index.
        let mut pruned = 0;
        for column in ["expires_at", "revoked_at"] {
            pruned += sqlx::query(&format!(
                "DELETE FROM api_tokens WHERE {column} IS NOT NULL AND {column} < $1"
            ))
            .bind(ts(before))
            .execute(&self.pool)
            .await?
            .rows_affected();
        }
        Ok(pruned)
    }

    async fn set_password(
        &self,
        user_id: &str,
        password_hash: &str,
        keep: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let mut tx = self.begin().await?;
        let updated =
            sqlx::query("UPDATE users SET password_hash = $2 WHERE id = $1 AND kind = 'user'")
                .bind(user_id)
                .bind(password_hash)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if updated == 0 {
            return Err(StoreError::not_found("user", user_id));
        }
        let ended = sqlx::query(
            "SELECT COUNT(*) AS n FROM api_tokens WHERE user_id = $1 AND kind = 'session'
                 AND id <> $2 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $3)",
        )
        .bind(user_id)
        .bind(keep.unwrap_or(""))
        .bind(ts(now))
        .fetch_one(&mut *tx)
        .await?
        .try_get::<i64, _>("n")?;
        // The sessions and every token made from one of them (without the password: bound to
        // it); API tokens made deliberately, with a password or by an admin, stay.
        sqlx::query(
            "WITH RECURSIVE lineage (id) AS (
                 SELECT id FROM api_tokens WHERE user_id = $1 AND kind = 'session' AND id <> $2
                 UNION SELECT t.id FROM api_tokens t JOIN lineage l ON t.parent_id = l.id
             )
             UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, $3)
             WHERE id IN (SELECT id FROM lineage)",
        )
        .bind(user_id)
        .bind(keep.unwrap_or(""))
        .bind(ts(now))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.tokens.clear();
        Ok(u64::try_from(ended).unwrap_or(0))
    }

    async fn login_attempt(
        &self,
        account: &str,
        user_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Verdict> {
        super::login_throttle::attempt(self, account, user_id, now).await
    }

    async fn login_succeeded(&self, account: &str) -> Result<()> {
        super::login_throttle::succeeded(self, account).await
    }

    async fn prune_login_throttle(&self, before: DateTime<Utc>, keep_unknown: u32) -> Result<u64> {
        super::login_throttle::prune(self, before, keep_unknown).await
    }

    async fn login_facts(&self, name: &str) -> Result<Option<LoginFacts>> {
        let row =
            sqlx::query("SELECT id, password_hash FROM users WHERE name = $1 AND kind = 'user'")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|row| {
            Ok(LoginFacts {
                user_id: row.try_get("id")?,
                password_hash: row.try_get("password_hash")?,
            })
        })
        .transpose()
    }

    async fn set_role(&self, user_id: &str, role: gpurent_types::Role) -> Result<User> {
        let mut tx = self.begin().await?;
        // Every admin's row first (PostgreSQL; SQLite has one writer): two admins demoting
        // each other at once cannot both count the other.
        sqlx::query("UPDATE users SET role = role WHERE role = 'admin'")
            .execute(&mut *tx)
            .await?;
        let current = sqlx::query("SELECT role FROM users WHERE id = $1")
            .bind(user_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::not_found("user", user_id))?;
        let current: String = current.try_get("role")?;
        if current == "admin" && role != gpurent_types::Role::Admin {
            let admins: i64 = sqlx::query("SELECT COUNT(*) AS n FROM users WHERE role = 'admin'")
                .fetch_one(&mut *tx)
                .await?
                .try_get("n")?;
            if admins <= 1 {
                return Err(StoreError::Conflict(format!(
                    "user {user_id} is the only admin: make another user admin first"
                )));
            }
        }
        sqlx::query("UPDATE users SET role = $2 WHERE id = $1")
            .bind(user_id)
            .bind(role.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.tokens.clear();
        crate::UserStore::get_user(self, user_id).await
    }

    async fn set_limits(
        &self,
        user_id: &str,
        max_reservations: Option<u32>,
        max_spend_per_hour: Option<Money>,
    ) -> Result<User> {
        let updated = sqlx::query(
            "UPDATE users SET max_reservations = COALESCE($2, max_reservations),
                              max_spend_per_hour = COALESCE($3, max_spend_per_hour)
             WHERE id = $1",
        )
        .bind(user_id)
        .bind(max_reservations.map(i64::from))
        .bind(max_spend_per_hour.map(Money::micros))
        .execute(&self.pool)
        .await?
        .rows_affected();
        if updated == 0 {
            return Err(StoreError::not_found("user", user_id));
        }
        crate::UserStore::get_user(self, user_id).await
    }
}
