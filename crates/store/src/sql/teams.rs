//! Teams in SQL: a team is a users row of kind `team` with the three accounts of any tenant;
//! its members in `team_members`. Changes to its members lock its row first, so that two
//! owners removing each other cannot both succeed.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{Team, TeamMember};
use gpurent_types::{Money, TeamRole};
use sqlx::{AnyConnection, Row};

use super::ledger;
use super::{from_ts, new_id, ts, SqlStore};
use crate::{Result, StoreError, TeamStore};

const TEAM_COLUMNS: &str = "u.id, u.name, u.created_at, a.balance
    FROM users u JOIN accounts a ON a.id = 'user:' || u.id";

fn team_from_row(row: &sqlx::any::AnyRow, role: Option<TeamRole>) -> Result<Team> {
    Ok(Team {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        balance: Money::from_micros(row.try_get("balance")?),
        created_at: from_ts(row.try_get("created_at")?)?,
        role,
        members: Vec::new(),
    })
}

fn role_of(text: &str) -> Result<TeamRole> {
    text.parse()
        .map_err(|e| StoreError::Corrupt(format!("team_members.role: {e}")))
}

fn member_from_row(row: &sqlx::any::AnyRow) -> Result<TeamMember> {
    let role: String = row.try_get("role")?;
    Ok(TeamMember {
        user_id: row.try_get("user_id")?,
        name: row.try_get("name")?,
        role: role_of(&role)?,
        added_at: from_ts(row.try_get("added_at")?)?,
    })
}

/// Locks the team's row for the rest of the transaction; `NotFound` when there is no team.
async fn lock_team(conn: &mut AnyConnection, team_id: &str) -> Result<()> {
    let locked = sqlx::query("UPDATE users SET kind = kind WHERE id = $1 AND kind = 'team'")
        .bind(team_id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if locked == 0 {
        return Err(StoreError::not_found("team", team_id));
    }
    Ok(())
}

async fn member(conn: &mut AnyConnection, team_id: &str, user_id: &str) -> Result<TeamMember> {
    let row = sqlx::query(
        "SELECT m.user_id, u.name, m.role, m.added_at FROM team_members m
         JOIN users u ON u.id = m.user_id WHERE m.team_id = $1 AND m.user_id = $2",
    )
    .bind(team_id)
    .bind(user_id)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| StoreError::not_found("member", user_id))?;
    member_from_row(&row)
}

async fn owners(conn: &mut AnyConnection, team_id: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM team_members WHERE team_id = $1 AND role = 'owner'",
    )
    .bind(team_id)
    .fetch_one(&mut *conn)
    .await?)
}

const LAST_OWNER: &str =
    "a team keeps at least one owner: make another member its owner first (gpurent teams add TEAM USER --role owner)";

#[async_trait]
impl TeamStore for SqlStore {
    async fn create_team(&self, name: &str, owner_id: &str, now: DateTime<Utc>) -> Result<Team> {
        let id = new_id();
        let at = ts(now);
        let mut tx = self.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO users (id, name, role, created_at, kind) VALUES ($1, $2, 'tenant', $3, 'team')
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&id)
        .bind(name)
        .bind(at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            return Err(StoreError::Conflict(format!(
                "the name {name:?} is taken by a user or a team"
            )));
        }
        for account in ledger::accounts_of(&id) {
            sqlx::query("INSERT INTO accounts (id, balance) VALUES ($1, 0)")
                .bind(&account)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(
            "INSERT INTO team_members (team_id, user_id, role, added_at) VALUES ($1, $2, 'owner', $3)",
        )
        .bind(&id)
        .bind(owner_id)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        let owner = member(&mut tx, &id, owner_id).await?;
        tx.commit().await?;
        Ok(Team {
            id,
            name: name.to_owned(),
            balance: Money::ZERO,
            created_at: from_ts(at)?,
            role: Some(TeamRole::Owner),
            members: vec![owner],
        })
    }

    async fn team_by_name(&self, name: &str) -> Result<Team> {
        let row = sqlx::query(&format!(
            "SELECT {TEAM_COLUMNS} WHERE u.name = $1 AND u.kind = 'team'"
        ))
        .bind(name)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("team", name))?;
        team_from_row(&row, None)
    }

    async fn list_teams(&self, user_id: Option<&str>) -> Result<Vec<Team>> {
        let rows = sqlx::query(&format!(
            "SELECT (SELECT m.role FROM team_members m
                     WHERE m.team_id = u.id AND m.user_id = $1) AS role, {TEAM_COLUMNS}
             WHERE u.kind = 'team' AND ($1 = '' OR EXISTS (
                 SELECT 1 FROM team_members m WHERE m.team_id = u.id AND m.user_id = $1))
             ORDER BY u.name"
        ))
        .bind(user_id.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let role: Option<String> = row.try_get("role")?;
                team_from_row(row, role.as_deref().map(role_of).transpose()?)
            })
            .collect()
    }

    async fn team_members(&self, team_id: &str) -> Result<Vec<TeamMember>> {
        let rows = sqlx::query(
            "SELECT m.user_id, u.name, m.role, m.added_at FROM team_members m
             JOIN users u ON u.id = m.user_id WHERE m.team_id = $1",
        )
        .bind(team_id)
        .fetch_all(&self.pool)
        .await?;
        let mut members = rows
            .iter()
            .map(member_from_row)
            .collect::<Result<Vec<_>>>()?;
        members.sort_by(|a, b| {
            b.role
                .rank()
                .cmp(&a.role.rank())
                .then_with(|| a.name.cmp(&b.name))
        });
        Ok(members)
    }

    async fn user_id_by_name(&self, name: &str) -> Result<String> {
        sqlx::query_scalar("SELECT id FROM users WHERE name = $1 AND kind = 'user'")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("user", name))
    }

    async fn team_role(&self, team_id: &str, user_id: &str) -> Result<Option<TeamRole>> {
        let role: Option<String> =
            sqlx::query_scalar("SELECT role FROM team_members WHERE team_id = $1 AND user_id = $2")
                .bind(team_id)
                .bind(user_id)
                .fetch_optional(&self.pool)
                .await?;
        role.as_deref().map(role_of).transpose()
    }

    async fn set_member(
        &self,
        team_id: &str,
        user_id: &str,
        role: TeamRole,
        owners_too: bool,
        now: DateTime<Utc>,
    ) -> Result<TeamMember> {
        let mut tx = self.begin().await?;
        lock_team(&mut tx, team_id).await?;
        let is_user: Option<String> =
            sqlx::query_scalar("SELECT id FROM users WHERE id = $1 AND kind = 'user'")
                .bind(user_id)
                .fetch_optional(&mut *tx)
                .await?;
        if is_user.is_none() {
            return Err(StoreError::not_found("user", user_id));
        }
        let was_owner = matches!(
            member(&mut tx, team_id, user_id).await,
            Ok(TeamMember {
                role: TeamRole::Owner,
                ..
            })
        );
        if was_owner && !owners_too {
            return Err(StoreError::OwnerUntouched);
        }
        if was_owner && role != TeamRole::Owner && owners(&mut tx, team_id).await? <= 1 {
            return Err(StoreError::Conflict(LAST_OWNER.to_owned()));
        }
        sqlx::query(
            "INSERT INTO team_members (team_id, user_id, role, added_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (team_id, user_id) DO UPDATE SET role = $3",
        )
        .bind(team_id)
        .bind(user_id)
        .bind(role.as_str())
        .bind(ts(now))
        .execute(&mut *tx)
        .await?;
        let member = member(&mut tx, team_id, user_id).await?;
        tx.commit().await?;
        Ok(member)
    }

    async fn remove_member(
        &self,
        team_id: &str,
        user_id: &str,
        owners_too: bool,
    ) -> Result<TeamMember> {
        let mut tx = self.begin().await?;
        lock_team(&mut tx, team_id).await?;
        let gone = member(&mut tx, team_id, user_id).await?;
        if gone.role == TeamRole::Owner && !owners_too {
            return Err(StoreError::OwnerUntouched);
        }
        if gone.role == TeamRole::Owner && owners(&mut tx, team_id).await? <= 1 {
            return Err(StoreError::Conflict(LAST_OWNER.to_owned()));
        }
        sqlx::query("DELETE FROM team_members WHERE team_id = $1 AND user_id = $2")
            .bind(team_id)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(gone)
    }

    async fn move_credit(
        &self,
        user_id: &str,
        team_id: &str,
        amount: Money,
        transfer_id: &str,
        now: DateTime<Utc>,
    ) -> Result<(Money, Money)> {
        let (from, to) = (ledger::user_account(user_id), ledger::user_account(team_id));
        let mut tx = self.begin().await?;
        lock_team(&mut tx, team_id).await?;
        if !ledger::made_before(&mut tx, transfer_id, amount).await? {
            // The debit's row, locked with the check: nothing spends it in between.
            let covered = sqlx::query(
                "UPDATE accounts SET balance = balance WHERE id = $1 AND balance >= $2",
            )
            .bind(&from)
            .bind(amount.micros())
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if covered == 0 {
                let balance = ledger::balance_of(&mut tx, &from)
                    .await?
                    .ok_or_else(|| StoreError::not_found("user", user_id))?;
                return Err(StoreError::InsufficientCredit {
                    needed: amount,
                    balance: Money::from_micros(balance),
                });
            }
            ledger::credit(&mut tx, transfer_id, &from, &to, amount, ts(now)).await?;
        }
        let mut balance = async |account: &str| -> Result<Money> {
            Ok(Money::from_micros(
                ledger::balance_of(&mut tx, account)
                    .await?
                    .unwrap_or_default(),
            ))
        };
        let (user, team) = (balance(&from).await?, balance(&to).await?);
        tx.commit().await?;
        Ok((user, team))
    }
}
