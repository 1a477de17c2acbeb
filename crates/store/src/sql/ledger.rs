//! Double-entry transfers: a unique id per transfer makes a retry a no-op, and the cached
//! account balances move in the same transaction as the transfer row.

use gpurent_types::Money;
use sqlx::AnyConnection;

use crate::{Result, StoreError};

pub(crate) const PLATFORM_CREDIT: &str = "platform:credit";
pub(crate) const PLATFORM_REVENUE: &str = "platform:revenue";

/// The balance account of a user.
pub(crate) fn user_account(user_id: &str) -> String {
    format!("user:{user_id}")
}

/// Money of a tenant set aside for its reservations: a first hour held at reservation, or the
/// unused part of a prepaid reserved block.
pub(crate) fn hold_account(user_id: &str) -> String {
    format!("hold:{user_id}")
}

/// What a host has earned from the work on its nodes.
pub(crate) fn earnings_account(user_id: &str) -> String {
    format!("earnings:{user_id}")
}

/// The accounts every user has.
pub(crate) fn accounts_of(user_id: &str) -> [String; 3] {
    [
        earnings_account(user_id),
        hold_account(user_id),
        user_account(user_id),
    ]
}

/// The host's part of a reservation's charges so far: rounded down once on the total, so the
/// settlements and the final charge add up to exactly this (`gpurent_billing::ending::host_part`).
pub(crate) fn host_part(charged: i64, share_bps: i64) -> i64 {
    gpurent_billing::ending::host_part(
        Money::from_micros(charged),
        u32::try_from(share_bps).unwrap_or(0),
    )
    .micros()
}

/// Pays a node's owner `earned`, its share of what a reservation was charged now (the bill's
/// `earned`), under the transfer id `id`.
pub(crate) async fn pay_host_share(
    conn: &mut AnyConnection,
    id: &str,
    owner: &str,
    node_id: Option<&str>,
    reservation_id: &str,
    earned: Money,
    at: i64,
) -> Result<bool> {
    transfer(
        conn,
        Transfer {
            id,
            debit: PLATFORM_REVENUE,
            credit: &earnings_account(owner),
            amount: earned.micros(),
            reservation_id: Some(reservation_id),
            at,
            kind: Kind::Earning,
            node_id,
            volume_id: None,
        },
    )
    .await
}

/// What a transfer is for; the statements count `Charge` transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Credit,
    Hold,
    Release,
    Charge,
    Earning,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Credit => "credit",
            Kind::Hold => "hold",
            Kind::Release => "release",
            Kind::Charge => "charge",
            Kind::Earning => "earning",
        }
    }
}

pub(crate) struct Transfer<'a> {
    pub id: &'a str,
    pub debit: &'a str,
    pub credit: &'a str,
    pub amount: i64,
    pub reservation_id: Option<&'a str>,
    pub at: i64,
    pub kind: Kind,
    /// The node that earned it (host earnings).
    pub node_id: Option<&'a str>,
    /// The volume it is for (its charges and the host's earnings from it).
    pub volume_id: Option<&'a str>,
}

/// Records the transfer unless one with its id exists. True when it was recorded now.
pub(crate) async fn transfer(conn: &mut AnyConnection, t: Transfer<'_>) -> Result<bool> {
    if t.amount <= 0 {
        return Ok(false);
    }
    if insert(conn, &t, "ON CONFLICT (id) DO NOTHING").await? == 0 {
        return Ok(false);
    }
    // Accounts are locked in id order, so that transactions moving money between overlapping
    // accounts cannot deadlock ("earnings:*" < "hold:*" < "platform:*" < "user:*").
    let mut moves = [(t.debit, -t.amount), (t.credit, t.amount)];
    moves.sort_by_key(|(account, _)| *account);
    for (account, delta) in moves {
        add(conn, account, delta).await?;
    }
    Ok(true)
}

/// Whether a transfer with this id was made before (a retried grant or move of credit):
/// `IdempotencyMismatch` when it was made with another amount.
pub(crate) async fn made_before(
    conn: &mut AnyConnection,
    id: &str,
    amount: gpurent_types::Money,
) -> Result<bool> {
    let earlier: Option<i64> = sqlx::query_scalar("SELECT amount FROM transfers WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    if earlier.is_some_and(|a| a != amount.micros()) {
        return Err(crate::StoreError::IdempotencyMismatch);
    }
    Ok(earlier.is_some())
}

/// Credit moved from `debit` to `credit` (a grant from the platform, or one's own credit into
/// a team), once per `id`.
pub(crate) async fn credit(
    conn: &mut AnyConnection,
    id: &str,
    debit: &str,
    credit: &str,
    amount: gpurent_types::Money,
    at: i64,
) -> Result<bool> {
    transfer(
        conn,
        Transfer {
            id,
            debit,
            credit,
            amount: amount.micros(),
            reservation_id: None,
            at,
            kind: Kind::Credit,
            node_id: None,
            volume_id: None,
        },
    )
    .await
}

pub(crate) async fn balance_of(conn: &mut AnyConnection, account: &str) -> Result<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_optional(&mut *conn)
            .await?,
    )
}

/// Money a tenant moves from its balance into its hold for a new reservation.
pub(crate) struct Hold<'a> {
    pub tenant_id: &'a str,
    pub reservation_id: &'a str,
    pub amount: i64,
    pub at: i64,
}

/// Adds to `batch` the lock of the accounts the holds of `tenants` move (PostgreSQL), in id
/// order as every transfer takes them, so that transactions moving money between overlapping
/// accounts cannot deadlock.
pub(crate) fn push_account_locks<'a>(
    batch: &mut super::batch::Batch,
    tenants: impl IntoIterator<Item = &'a str>,
) {
    use super::batch::Arg;
    let mut accounts: Vec<String> = tenants
        .into_iter()
        .flat_map(|t| [hold_account(t), user_account(t)])
        .collect();
    accounts.sort();
    accounts.dedup();
    if accounts.is_empty() {
        return;
    }
    batch.push(
        format!(
            "SELECT id FROM accounts WHERE id IN ({}) ORDER BY id FOR UPDATE",
            super::batch::placeholders(1, accounts.len())
        ),
        accounts.into_iter().map(Arg::from).collect(),
    );
}

/// The holds [`push_holds`] added to a batch.
pub(crate) struct Holds {
    /// The answers of the credit and the guarded debit; `None`: nothing to move.
    parts: Option<(usize, usize)>,
    tenants: u64,
}

impl Holds {
    /// Whether every tenant's balance covered its holds (when one did not, nothing may be
    /// kept: the caller rolls back, which undoes the credits too).
    pub fn covered(&self, answers: &super::batch::Answers) -> Result<bool> {
        let Some((credit, debit)) = self.parts else {
            return Ok(true);
        };
        if answers.affected(credit) != self.tenants {
            return Err(StoreError::Corrupt(
                "a tenant has no hold account".to_owned(),
            ));
        }
        Ok(answers.affected(debit) == self.tenants)
    }
}

/// Adds to `batch` the moving of each hold's amount from its tenant's balance to its hold
/// account, only where the balance covers all of that tenant's holds (the guard is in the
/// UPDATE itself, so two transactions cannot both spend the same money), with a transfer row
/// each. Holds of nothing move nothing. The credits come before the debits, in account id
/// order as every transfer takes them; where the statements may run as one
/// (`Batch::run_as_one`), the caller locks the accounts first ([`push_account_locks`]).
pub(crate) fn push_holds(batch: &mut super::batch::Batch, holds: &[Hold<'_>]) -> Holds {
    use super::batch::Arg;
    let mut per_tenant: std::collections::BTreeMap<&str, i64> = Default::default();
    for h in holds.iter().filter(|h| h.amount > 0) {
        let sum = per_tenant.entry(h.tenant_id).or_default();
        *sum = sum.saturating_add(h.amount);
    }
    if per_tenant.is_empty() {
        return Holds {
            parts: None,
            tenants: 0,
        };
    }
    let values = |account: fn(&str) -> String| {
        let mut rows = Vec::with_capacity(per_tenant.len());
        let mut args = Vec::with_capacity(per_tenant.len() * 2);
        for (tenant, sum) in &per_tenant {
            let n = args.len();
            rows.push(format!("(${}, CAST(${} AS BIGINT))", n + 1, n + 2));
            args.push(Arg::from(account(tenant)));
            args.push(Arg::from(*sum));
        }
        (rows.join(", "), args)
    };
    let (rows, args) = values(hold_account);
    let credit = batch.push(
        format!(
            "UPDATE accounts SET balance = balance + v.column2 FROM (VALUES {rows}) AS v
             WHERE accounts.id = v.column1"
        ),
        args,
    );
    let (rows, args) = values(user_account);
    let debit = batch.push(
        format!(
            "UPDATE accounts SET balance = balance - v.column2 FROM (VALUES {rows}) AS v
             WHERE accounts.id = v.column1 AND accounts.balance >= v.column2"
        ),
        args,
    );
    let mut rows = Vec::new();
    let mut args = Vec::new();
    for h in holds.iter().filter(|h| h.amount > 0) {
        let n = args.len();
        rows.push(format!(
            "(${}, ${}, ${}, CAST(${} AS BIGINT), ${}, CAST(${} AS BIGINT), '{}', NULL)",
            n + 1,
            n + 2,
            n + 3,
            n + 4,
            n + 5,
            n + 6,
            Kind::Hold.as_str()
        ));
        args.push(Arg::from(format!("hold:{}", h.reservation_id)));
        args.push(Arg::from(user_account(h.tenant_id)));
        args.push(Arg::from(hold_account(h.tenant_id)));
        args.push(Arg::from(h.amount));
        args.push(Arg::from(h.reservation_id));
        args.push(Arg::from(h.at));
    }
    batch.push(
        format!(
            "INSERT INTO transfers (id, debit_account, credit_account, amount, reservation_id,
                created_at, kind, node_id) VALUES {}",
            rows.join(", ")
        ),
        args,
    );
    Holds {
        parts: Some((credit, debit)),
        tenants: u64::try_from(per_tenant.len()).unwrap_or(u64::MAX),
    }
}

/// Writes the transfer row; `on_conflict` is empty or an `ON CONFLICT` clause.
async fn insert(conn: &mut AnyConnection, t: &Transfer<'_>, on_conflict: &str) -> Result<u64> {
    Ok(sqlx::query(&format!(
        "INSERT INTO transfers (id, debit_account, credit_account, amount, reservation_id,
            created_at, kind, node_id, volume_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) {on_conflict}"
    ))
    .bind(t.id)
    .bind(t.debit)
    .bind(t.credit)
    .bind(t.amount)
    .bind(t.reservation_id)
    .bind(t.at)
    .bind(t.kind.as_str())
    .bind(t.node_id)
    .bind(t.volume_id)
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// Moves an account's balance; an account that does not exist is an error (and the
/// transaction, with its transfer row, is abandoned).
pub(crate) async fn add(conn: &mut AnyConnection, account: &str, delta: i64) -> Result<()> {
    let moved = sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
        .bind(delta)
        .bind(account)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if moved != 1 {
        return Err(StoreError::Corrupt(format!("no account {account:?}")));
    }
    Ok(())
}
