//! Double-entry transfers: a unique id per transfer makes a retry a no-op, and the cached
//! account balances move in the same transaction as the transfer row.

use sqlx::AnyConnection;

use crate::Result;

pub(crate) const PLATFORM_CREDIT: &str = "platform:credit";
pub(crate) const PLATFORM_REVENUE: &str = "platform:revenue";

/// The balance account of a user.
pub(crate) fn user_account(user_id: &str) -> String {
    format!("user:{user_id}")
}

pub(crate) struct Transfer<'a> {
    pub id: &'a str,
    pub debit: &'a str,
    pub credit: &'a str,
    pub amount: i64,
    pub reservation_id: Option<&'a str>,
    pub at: i64,
}

/// Records the transfer unless one with its id exists. True when it was recorded now.
pub(crate) async fn transfer(conn: &mut AnyConnection, t: Transfer<'_>) -> Result<bool> {
    if t.amount <= 0 {
        return Ok(false);
    }
    let inserted = sqlx::query(
        "INSERT INTO transfers (id, debit_account, credit_account, amount, reservation_id, created_at)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
    )
    .bind(t.id)
    .bind(t.debit)
    .bind(t.credit)
    .bind(t.amount)
    .bind(t.reservation_id)
    .bind(t.at)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(false);
    }
    // Accounts are locked in id order, so that transactions moving money between overlapping
    // accounts cannot deadlock ("platform:*" sorts before every "user:*").
    let mut moves = [(t.debit, -t.amount), (t.credit, t.amount)];
    moves.sort_by_key(|(account, _)| *account);
    for (account, delta) in moves {
        sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
            .bind(delta)
            .bind(account)
            .execute(&mut *conn)
            .await?;
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
