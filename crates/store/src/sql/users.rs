//! Users, API tokens, credit grants and the ledger check.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{DayUsage, ReservationUsage, Usage, User, VolumeUsage};
use gpurent_types::{Money, Role};
use sqlx::Row;

use super::ledger::{self, Kind, Transfer, PLATFORM_CREDIT};
use super::{from_ts, new_id, ts, SqlStore};
use crate::{
    AuthUser, Backend, IdempotencyClaim, LedgerCheck, NewUser, Result, StoreError, UserStore,
};

const USER_COLUMNS: &str = "u.id, u.name, u.role, u.created_at, a.balance,
    u.max_reservations, u.max_spend_per_hour
    FROM users u JOIN accounts a ON a.id = 'user:' || u.id";

fn user_from_row(row: &sqlx::any::AnyRow) -> Result<User> {
    let role: String = row.try_get("role")?;
    Ok(User {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        role: role
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("{e}")))?,
        balance: Money::from_micros(row.try_get("balance")?),
        created_at: from_ts(row.try_get("created_at")?)?,
        max_reservations: row
            .try_get::<Option<i64>, _>("max_reservations")?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        max_spend_per_hour: row
            .try_get::<Option<i64>, _>("max_spend_per_hour")?
            .map(Money::from_micros),
    })
}

#[async_trait]
impl UserStore for SqlStore {
    fn backend(&self) -> Backend {
        self.backend
    }

    async fn ping(&self) -> Result<()> {
        self.ready().await
    }

    async fn ensure_admin(&self, token_hash: &str, now: DateTime<Utc>) -> Result<bool> {
        let exists: Option<String> =
            sqlx::query_scalar("SELECT id FROM users WHERE role = 'admin' LIMIT 1")
                .fetch_optional(&self.pool)
                .await?;
        if exists.is_some() {
            return Ok(false);
        }
        let new = NewUser {
            name: "admin".to_owned(),
            role: Role::Admin,
            token_hash: token_hash.to_owned(),
            credit: Money::ZERO,
        };
        match self.create_user(new, now).await {
            Ok(_) => Ok(true),
            // Another replica bootstrapped it first.
            Err(StoreError::Conflict(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn authenticate(&self, token_hash: &str) -> Result<Option<AuthUser>> {
        let row = sqlx::query(
            "SELECT u.id, u.name, u.role FROM api_tokens t JOIN users u ON u.id = t.user_id
             WHERE t.token_hash = $1 AND t.revoked_at IS NULL",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            let role: String = row.try_get("role")?;
            Ok(AuthUser {
                id: row.try_get("id")?,
                name: row.try_get("name")?,
                role: role
                    .parse()
                    .map_err(|e| StoreError::Corrupt(format!("{e}")))?,
            })
        })
        .transpose()
    }

    async fn create_user(&self, new: NewUser, now: DateTime<Utc>) -> Result<User> {
        let id = new_id();
        let at = ts(now);
        let mut tx = self.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO users (id, name, role, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&id)
        .bind(&new.name)
        .bind(new.role.as_str())
        .bind(at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            return Err(StoreError::Conflict(format!(
                "a user or team named {:?} already exists",
                new.name
            )));
        }
        sqlx::query(
            "INSERT INTO api_tokens (token_hash, user_id, created_at, id, kind)
             VALUES ($1, $2, $3, $4, 'api')",
        )
        .bind(&new.token_hash)
        .bind(&id)
        .bind(at)
        .bind(new_id())
        .execute(&mut *tx)
        .await?;
        for account in ledger::accounts_of(&id) {
            sqlx::query("INSERT INTO accounts (id, balance) VALUES ($1, 0)")
                .bind(&account)
                .execute(&mut *tx)
                .await?;
        }
        let account = ledger::user_account(&id);
        let transfer_id = format!("grant:{id}:initial");
        ledger::transfer(
            &mut tx,
            Transfer {
                id: &transfer_id,
                debit: PLATFORM_CREDIT,
                credit: &account,
                amount: new.credit.micros(),
                reservation_id: None,
                at,
                kind: Kind::Credit,
                node_id: None,
                volume_id: None,
            },
        )
        .await?;
        tx.commit().await?;
        Ok(User {
            id,
            name: new.name,
            role: new.role,
            balance: new.credit,
            created_at: now,
            max_reservations: None,
            max_spend_per_hour: None,
        })
    }

    async fn get_user(&self, id: &str) -> Result<User> {
        let row = sqlx::query(&format!("SELECT {USER_COLUMNS} WHERE u.id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("user", id))?;
        user_from_row(&row)
    }

    async fn list_users(&self, limit: u32, after: Option<&str>) -> Result<Vec<User>> {
        sqlx::query(&format!(
            "SELECT {USER_COLUMNS} WHERE u.kind = 'user' AND ($1 = ''
                OR u.created_at > (SELECT created_at FROM users WHERE id = $1)
                OR (u.created_at = (SELECT created_at FROM users WHERE id = $1) AND u.id > $1))
             ORDER BY u.created_at, u.id LIMIT $2"
        ))
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit.min(1000)))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(user_from_row)
        .collect()
    }

    async fn grant_credit(
        &self,
        user_id: &str,
        amount: Money,
        transfer_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Money> {
        let account = ledger::user_account(user_id);
        let mut tx = self.begin().await?;
        if ledger::balance_of(&mut tx, &account).await?.is_none() {
            return Err(StoreError::not_found("user", user_id));
        }
        ledger::made_before(&mut tx, transfer_id, amount).await?;
        ledger::credit(
            &mut tx,
            transfer_id,
            PLATFORM_CREDIT,
            &account,
            amount,
            ts(now),
        )
        .await?;
        let balance = ledger::balance_of(&mut tx, &account)
            .await?
            .unwrap_or_default();
        tx.commit().await?;
        Ok(Money::from_micros(balance))
    }

    async fn balance(&self, user_id: &str) -> Result<Money> {
        let mut conn = self.pool.acquire().await?;
        ledger::balance_of(&mut conn, &ledger::user_account(user_id))
            .await?
            .map(Money::from_micros)
            .ok_or_else(|| StoreError::not_found("user", user_id))
    }

    async fn accounts(&self, user_id: &str) -> Result<(Money, Money, Money)> {
        let mut conn = self.pool.acquire().await?;
        let [earnings, hold, user] = ledger::accounts_of(user_id);
        let mut get = async |account: &str| {
            ledger::balance_of(&mut conn, account)
                .await?
                .map(Money::from_micros)
                .ok_or_else(|| StoreError::not_found("user", user_id))
        };
        Ok((get(&user).await?, get(&hold).await?, get(&earnings).await?))
    }

    async fn usage(&self, user_id: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<Usage> {
        // Charges come out of the balance, or out of the hold for prepaid blocks.
        let rows = sqlx::query(
            "SELECT t.reservation_id, t.volume_id, v.name AS volume_name, t.amount, t.created_at
             FROM transfers t LEFT JOIN volumes v ON v.id = t.volume_id
             WHERE t.debit_account IN ($1, $4) AND t.kind = 'charge'
               AND t.created_at >= $2 AND t.created_at < $3
             ORDER BY t.created_at",
        )
        .bind(ledger::user_account(user_id))
        .bind(ts(from))
        .bind(ts(to))
        .bind(ledger::hold_account(user_id))
        .fetch_all(&self.pool)
        .await?;
        let mut by_reservation: BTreeMap<String, i64> = BTreeMap::new();
        let mut by_volume: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut by_day: BTreeMap<String, i64> = BTreeMap::new();
        let mut total = 0i64;
        for row in rows {
            let amount: i64 = row.try_get("amount")?;
            match (
                row.try_get::<Option<String>, _>("reservation_id")?,
                row.try_get::<Option<String>, _>("volume_id")?,
            ) {
                (Some(reservation), _) => *by_reservation.entry(reservation).or_default() += amount,
                (None, Some(volume)) => {
                    let name: Option<String> = row.try_get("volume_name")?;
                    *by_volume
                        .entry((volume, name.unwrap_or_default()))
                        .or_default() += amount;
                }
                (None, None) => {
                    return Err(StoreError::Corrupt(
                        "a charge for neither a reservation nor a volume".into(),
                    ))
                }
            }
            let day = from_ts(row.try_get("created_at")?)?
                .format("%Y-%m-%d")
                .to_string();
            *by_day.entry(day).or_default() += amount;
            total += amount;
        }
        Ok(Usage {
            user_id: user_id.to_owned(),
            from,
            to,
            total: Money::from_micros(total),
            reservations: by_reservation
                .into_iter()
                .map(|(reservation_id, m)| ReservationUsage {
                    reservation_id,
                    charged: Money::from_micros(m),
                })
                .collect(),
            volumes: by_volume
                .into_iter()
                .map(|((volume_id, name), m)| VolumeUsage {
                    volume_id,
                    name,
                    charged: Money::from_micros(m),
                })
                .collect(),
            days: by_day
                .into_iter()
                .map(|(date, m)| DayUsage {
                    date,
                    charged: Money::from_micros(m),
                })
                .collect(),
        })
    }

    async fn ledger_check(&self) -> Result<LedgerCheck> {
        // Every figure from one snapshot, so that work going on meanwhile (a reservation ending
        // between two of the queries) cannot look like a broken ledger.
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
        }
        // One pass over the transfers, both sides of each.
        let rows = sqlx::query(
            "SELECT a.id, a.balance, CAST(COALESCE(m.derived, 0) AS BIGINT) AS derived
             FROM accounts a LEFT JOIN (
                 SELECT account, SUM(delta) AS derived FROM (
                     SELECT credit_account AS account, amount AS delta FROM transfers
                     UNION ALL
                     SELECT debit_account, -amount FROM transfers) x
                 GROUP BY account) m ON m.account = a.id
             ORDER BY a.id",
        )
        .fetch_all(&mut *tx)
        .await?;
        let transfers: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM transfers")
            .fetch_one(&mut *tx)
            .await?;
        let mut check = LedgerCheck {
            transfers,
            sum: 0,
            mismatched: Vec::new(),
            problems: Vec::new(),
        };
        let mut holds: BTreeMap<String, i64> = BTreeMap::new();
        for row in rows {
            let id: String = row.try_get("id")?;
            let cached: i64 = row.try_get("balance")?;
            let derived: i64 = row.try_get("derived")?;
            check.sum += cached;
            if cached != derived {
                check.mismatched.push((id.clone(), cached, derived));
            }
            if id.starts_with("hold:") && cached != 0 {
                holds.insert(id, cached);
            }
        }
        // Money moved to or from an account nobody has.
        let unknown: Vec<String> = sqlx::query_scalar(
            "SELECT x.account FROM (SELECT debit_account AS account FROM transfers
                                    UNION SELECT credit_account FROM transfers) x
             WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = x.account)
             ORDER BY x.account",
        )
        .fetch_all(&mut *tx)
        .await?;
        check.problems.extend(
            unknown
                .into_iter()
                .map(|a| format!("transfers move money of {a}, which is no account")),
        );
        // A tenant's hold is what its reservations keep there, no more and no less.
        let kept = sqlx::query(
            "SELECT tenant_id, CAST(SUM(held) AS BIGINT) AS kept FROM meters
             WHERE held <> 0 GROUP BY tenant_id",
        )
        .fetch_all(&mut *tx)
        .await?;
        for row in kept {
            let account = ledger::hold_account(&row.try_get::<String, _>("tenant_id")?);
            let kept: i64 = row.try_get("kept")?;
            let held = holds.remove(&account).unwrap_or(0);
            if held != kept {
                check.problems.push(format!(
                    "{account} holds {} but its reservations keep {}",
                    Money::from_micros(held),
                    Money::from_micros(kept)
                ));
            }
        }
        for (account, held) in holds {
            check.problems.push(format!(
                "{account} holds {} for no reservation",
                Money::from_micros(held)
            ));
        }
        // Each node's owner earned exactly its share of every charge for work on the node.
        let mut owed: BTreeMap<String, i64> = BTreeMap::new();
        // A reservation moved off a lost node earned that node's owner a share of what it was
        // charged there (`lost_runs`), and its current node's owner a share of the rest.
        let charged = sqlx::query(
            "SELECT node_id, base_charged AS charged_from, charged AS charged_to, host_share_bps
             FROM meters WHERE charged > 0 AND host_share_bps > 0 AND node_id IS NOT NULL
             UNION ALL
             SELECT node_id, charged_from, charged_to, host_share_bps FROM lost_runs",
        )
        .fetch_all(&mut *tx)
        .await?;
        for row in charged {
            let bps: i64 = row.try_get("host_share_bps")?;
            *owed.entry(row.try_get("node_id")?).or_default() +=
                ledger::host_part(row.try_get("charged_to")?, bps)
                    - ledger::host_part(row.try_get("charged_from")?, bps);
        }
        // A volume was charged in transfers exactly what it says it was.
        let off: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT v.id, v.charged, CAST(COALESCE(SUM(t.amount), 0) AS BIGINT) AS transferred
             FROM volumes v LEFT JOIN transfers t ON t.volume_id = v.id AND t.kind = 'charge'
             GROUP BY v.id, v.charged HAVING v.charged <> COALESCE(SUM(t.amount), 0)
             ORDER BY v.id",
        )
        .fetch_all(&mut *tx)
        .await?;
        check
            .problems
            .extend(off.into_iter().map(|(id, charged, transferred)| {
                format!(
                    "volume {id} was charged {} but its charges add up to {}",
                    Money::from_micros(charged),
                    Money::from_micros(transferred)
                )
            }));
        // And a share of what its local volumes were charged over their lives.
        let volumes = sqlx::query(
            "SELECT v.node_id, v.charged, v.host_share_bps
             FROM volumes v JOIN nodes n ON n.id = v.node_id
             WHERE v.kind = 'local' AND v.charged > 0 AND v.host_share_bps > 0
               AND n.owner_id IS NOT NULL",
        )
        .fetch_all(&mut *tx)
        .await?;
        for row in volumes {
            *owed.entry(row.try_get("node_id")?).or_default() +=
                ledger::host_part(row.try_get("charged")?, row.try_get("host_share_bps")?);
        }
        let earned = sqlx::query(
            "SELECT node_id, CAST(SUM(amount) AS BIGINT) AS earned FROM transfers
             WHERE kind = 'earning' GROUP BY node_id",
        )
        .fetch_all(&mut *tx)
        .await?;
        for row in earned {
            let node: Option<String> = row.try_get("node_id")?;
            let node = node.unwrap_or_default();
            let earned: i64 = row.try_get("earned")?;
            let due = owed.remove(&node).unwrap_or(0);
            if earned != due {
                check.problems.push(format!(
                    "node {node} earned {} but its share of the charges is {}",
                    Money::from_micros(earned),
                    Money::from_micros(due)
                ));
            }
        }
        for (node, due) in owed.into_iter().filter(|(_, due)| *due != 0) {
            check.problems.push(format!(
                "node {node} earned nothing but its share of the charges is {}",
                Money::from_micros(due)
            ));
        }
        tx.commit().await?;
        Ok(check)
    }

    async fn begin_idempotent(
        &self,
        scope: &str,
        key_hash: &str,
        request_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<IdempotencyClaim> {
        self.claim_key(scope, key_hash, request_hash, now).await
    }

    async fn finish_idempotent(
        &self,
        scope: &str,
        key_hash: &str,
        status: u16,
        sealed_response: &str,
    ) -> Result<()> {
        self.finish_key(scope, key_hash, status, sealed_response)
            .await
    }

    async fn abort_idempotent(&self, scope: &str, key_hash: &str) -> Result<()> {
        self.abort_key(scope, key_hash).await
    }

    async fn prune_idempotency_keys(&self, before: DateTime<Utc>) -> Result<u64> {
        self.prune_keys(before).await
    }
}
