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

pub(crate) async fn balance_of(conn: &mut AnyConnection, account: &str) -> Result<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_optional(&mut *conn)
            .await?,
    )
}

/// Moves `amount` from `debit` to `credit` only if `debit` holds at least that much; false (and
/// nothing moved) when it does not. The guard is in the UPDATE itself, so two transactions
/// cannot both spend the same money.
pub(crate) async fn transfer_covered(conn: &mut AnyConnection, t: Transfer<'_>) -> Result<bool> {
    if t.amount <= 0 {
        return Ok(true);
    }
    // In id order like every transfer; the credit side is undone with the transaction.
    let debit_first = t.debit < t.credit;
    if !debit_first {
        add(conn, t.credit, t.amount).await?;
    }
    let covered =
        sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = $2 AND balance >= $1")
            .bind(t.amount)
            .bind(t.debit)
            .execute(&mut *conn)
            .await?
            .rows_affected()
            == 1;
    if !covered {
        return Ok(false);
    }
    if debit_first {
        add(conn, t.credit, t.amount).await?;
    }
    Ok(insert(conn, &t, "").await? == 1)
}

/// Writes the transfer row; `on_conflict` is empty or an `ON CONFLICT` clause.
async fn insert(conn: &mut AnyConnection, t: &Transfer<'_>, on_conflict: &str) -> Result<u64> {
    Ok(sqlx::query(&format!(
        "INSERT INTO transfers (id, debit_account, credit_account, amount, reservation_id,
            created_at, kind, node_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) {on_conflict}"
    ))
    .bind(t.id)
    .bind(t.debit)
    .bind(t.credit)
    .bind(t.amount)
    .bind(t.reservation_id)
    .bind(t.at)
    .bind(t.kind.as_str())
    .bind(t.node_id)
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// Moves an account's balance; an account that does not exist is an error (and the
/// transaction, with its transfer row, is abandoned).
async fn add(conn: &mut AnyConnection, account: &str, delta: i64) -> Result<()> {
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
