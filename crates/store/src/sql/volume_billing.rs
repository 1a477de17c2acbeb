//! Volumes' charges in SQL: a volume is settled up to a time under its row's lock, by the rule
//! of `gpurent_billing::storage` (its size per GB-month, per second, a running total per
//! stretch rounded down once), through the ledger: its owner charged, its node's owner paid
//! its share. Periodically (`settle_volumes`), and at each resize and removal.

use chrono::{DateTime, Utc};
use gpurent_types::Money;
use sqlx::{AnyConnection, Row};

use super::ledger::{self, Kind, Transfer, PLATFORM_REVENUE};
use super::{retry_transient, ts, SqlStore};
use crate::{Backend, Result};

/// The states in which a volume is charged: it exists, or is being made or grown.
pub(super) const BILLED_STATES: &str = "('creating', 'ready', 'resizing')";

/// Volumes settled in one transaction by the periodic settlement.
const BATCH: i64 = 200;

const MICROS: i64 = 1_000_000;

fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Charges volume `id` for its time up to `until` (unix microseconds), under its row's lock:
/// what its stretch owes by then less what it was charged for it, under the transfer id
/// `charge:vol:<id>:<until>`; its node's owner earns their share of its lifetime total
/// (`earn:vol:<id>:<until>`). A volume not billed (being deleted, failed, gone), or already
/// settled past `until`, is left as it is. Its owner's volumes are marked unpaid while their
/// balance is below zero.
pub(super) async fn settle(
    conn: &mut AnyConnection,
    backend: Backend,
    id: &str,
    until: i64,
) -> Result<()> {
    match charge(conn, backend, id, until).await? {
        Some(owner) => mark_unpaid(conn, &owner, until).await,
        None => Ok(()),
    }
}

/// The charge of `settle`, without marking the owner's volumes: the owner, when the volume was
/// billed up to `until` (the periodic settlement marks each owner once per batch).
async fn charge(
    conn: &mut AnyConnection,
    backend: Backend,
    id: &str,
    until: i64,
) -> Result<Option<String>> {
    let lock = match backend {
        Backend::Postgres => " FOR UPDATE OF v",
        Backend::Sqlite => "",
    };
    let Some(row) = sqlx::query(&format!(
        "SELECT v.owner_id, v.kind, v.size_bytes, v.price_per_gb_month, v.host_share_bps,
                v.billed_from, v.billed_until, v.stretch_charged, v.charged, v.node_id,
                n.owner_id AS host
         FROM volumes v LEFT JOIN nodes n ON n.id = v.node_id
         WHERE v.id = $1 AND v.state IN {BILLED_STATES}{lock}"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let billed_until: i64 = row.try_get("billed_until")?;
    if until <= billed_until {
        return Ok(None);
    }
    let owner: String = row.try_get("owner_id")?;
    let billed_from: i64 = row.try_get("billed_from")?;
    let stretch_charged: i64 = row.try_get("stretch_charged")?;
    let charged: i64 = row.try_get("charged")?;
    let due = gpurent_billing::storage_due(
        Money::from_micros(row.try_get("price_per_gb_month")?),
        unsigned(row.try_get("size_bytes")?),
        unsigned(until.saturating_sub(billed_from) / MICROS),
        Money::from_micros(stretch_charged),
    )
    .micros();
    sqlx::query(
        "UPDATE volumes SET billed_until = $1, stretch_charged = $2, charged = $3 WHERE id = $4",
    )
    .bind(until)
    .bind(stretch_charged.saturating_add(due))
    .bind(charged.saturating_add(due))
    .bind(id)
    .execute(&mut *conn)
    .await?;
    if due == 0 {
        return Ok(Some(owner));
    }
    ledger::transfer(
        conn,
        Transfer {
            id: &format!("charge:vol:{id}:{until}"),
            debit: &ledger::user_account(&owner),
            credit: PLATFORM_REVENUE,
            amount: due,
            reservation_id: None,
            at: until,
            kind: Kind::Charge,
            node_id: None,
            volume_id: Some(id),
        },
    )
    .await?;
    let node_id: Option<String> = row.try_get("node_id")?;
    let host: Option<String> = row.try_get("host")?;
    if let (Some(node_id), Some(host), "local") =
        (node_id, host, row.try_get::<String, _>("kind")?.as_str())
    {
        let bps: i64 = row.try_get("host_share_bps")?;
        let earned =
            ledger::host_part(charged.saturating_add(due), bps) - ledger::host_part(charged, bps);
        ledger::transfer(
            conn,
            Transfer {
                id: &format!("earn:vol:{id}:{until}"),
                debit: PLATFORM_REVENUE,
                credit: &ledger::earnings_account(&host),
                amount: earned,
                reservation_id: None,
                at: until,
                kind: Kind::Earning,
                node_id: Some(&node_id),
                volume_id: Some(id),
            },
        )
        .await?;
    }
    Ok(Some(owner))
}

/// Marks `owner`'s billed volumes unpaid from `at` while their balance is below zero (from
/// the first time it was), and paid again once it is not.
pub(super) async fn mark_unpaid(conn: &mut AnyConnection, owner: &str, at: i64) -> Result<()> {
    let balance = ledger::balance_of(conn, &ledger::user_account(owner))
        .await?
        .unwrap_or(0);
    if balance < 0 {
        sqlx::query(&format!(
            "UPDATE volumes SET unpaid_since = $1
             WHERE owner_id = $2 AND unpaid_since IS NULL AND state IN {BILLED_STATES}"
        ))
        .bind(at)
        .bind(owner)
        .execute(&mut *conn)
        .await?;
    } else {
        sqlx::query(
            "UPDATE volumes SET unpaid_since = NULL WHERE owner_id = $1 AND unpaid_since IS NOT NULL",
        )
        .bind(owner)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

impl SqlStore {
    /// Settles every billed volume last settled a `period` ago or more, up to `now`, a batch
    /// of volumes per transaction. The number of volumes settled.
    pub(crate) async fn settle_volume_charges(
        &self,
        now: DateTime<Utc>,
        period: std::time::Duration,
    ) -> Result<usize> {
        let at = ts(now);
        let period = i64::try_from(period.as_micros())
            .unwrap_or(i64::MAX)
            .max(MICROS);
        let cutoff = at.saturating_sub(period);
        let mut settled = 0;
        loop {
            let ids: Vec<String> = sqlx::query_scalar(&format!(
                "SELECT id FROM volumes WHERE state IN {BILLED_STATES} AND billed_until <= $1
                 ORDER BY billed_until, id LIMIT $2"
            ))
            .bind(cutoff)
            .bind(BATCH)
            .fetch_all(&self.pool)
            .await?;
            if ids.is_empty() {
                return Ok(settled);
            }
            retry_transient("settle volumes", || async {
                let mut tx = self.begin().await?;
                let mut owners = std::collections::BTreeSet::new();
                for id in &ids {
                    owners.extend(charge(&mut tx, self.backend, id, at).await?);
                }
                for owner in &owners {
                    mark_unpaid(&mut tx, owner, at).await?;
                }
                tx.commit().await?;
                Ok(())
            })
            .await?;
            settled += ids.len();
            if ids.len() < usize::try_from(BATCH).unwrap_or(usize::MAX) {
                return Ok(settled);
            }
        }
    }
}
