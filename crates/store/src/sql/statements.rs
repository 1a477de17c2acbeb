//! Statements read from the ledger: monthly invoice lines, host earnings per node, and how
//! spot instances ended.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{InvoiceLine, NodeEarnings, SpotStats, StorageLine};
use gpurent_types::{Money, Tier};
use sqlx::Row;

use super::ledger;
use super::rows::{reservation_from_row, RESERVATION_COLUMNS};
use super::{from_ts, ts, SqlStore};
use crate::{Result, StatementStore, StoreError};

#[async_trait]
impl StatementStore for SqlStore {
    async fn invoice_lines(
        &self,
        user_id: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<InvoiceLine>> {
        // Exactly the charges `usage` counts, grouped by reservation.
        let charges = sqlx::query(
            "SELECT reservation_id, CAST(SUM(amount) AS BIGINT) AS amount FROM transfers
             WHERE debit_account IN ($1, $2) AND kind = 'charge' AND volume_id IS NULL
               AND created_at >= $3 AND created_at < $4
             GROUP BY reservation_id ORDER BY reservation_id",
        )
        .bind(ledger::user_account(user_id))
        .bind(ledger::hold_account(user_id))
        .bind(ts(from))
        .bind(ts(to))
        .fetch_all(&self.pool)
        .await?;
        let mut lines = Vec::with_capacity(charges.len());
        for row in charges {
            let id: Option<String> = row.try_get("reservation_id")?;
            let id =
                id.ok_or_else(|| StoreError::Corrupt("a charge without a reservation".into()))?;
            let r = sqlx::query(&format!("SELECT {RESERVATION_COLUMNS} WHERE r.id = $1"))
                .bind(&id)
                .fetch_one(&self.pool)
                .await?;
            let r = reservation_from_row(&r)?;
            lines.push(InvoiceLine {
                reservation_id: id,
                gpu_type: r.gpu_type,
                gpu_count: r.gpu_count,
                vram_gb: r.vram_gb,
                tier: r.tier,
                price_per_hour: r.price_per_hour,
                started_at: r.started_at,
                ended_at: r.ended_at,
                amount: Money::from_micros(row.try_get("amount")?),
            });
        }
        lines.sort_by(|a, b| {
            (a.started_at, &a.reservation_id).cmp(&(b.started_at, &b.reservation_id))
        });
        Ok(lines)
    }

    async fn storage_lines(
        &self,
        user_id: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<StorageLine>> {
        // Exactly the volume charges `usage` counts, grouped by volume.
        let rows = sqlx::query(
            "SELECT v.id, v.name, v.size_bytes, v.price_per_gb_month, v.created_at, v.deleted_at,
                    c.amount
             FROM (SELECT volume_id, CAST(SUM(amount) AS BIGINT) AS amount FROM transfers
                   WHERE debit_account = $1 AND kind = 'charge' AND volume_id IS NOT NULL
                     AND created_at >= $2 AND created_at < $3
                   GROUP BY volume_id) c
             JOIN volumes v ON v.id = c.volume_id
             ORDER BY v.created_at, v.id",
        )
        .bind(ledger::user_account(user_id))
        .bind(ts(from))
        .bind(ts(to))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StorageLine {
                    volume_id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    size_bytes: u64::try_from(r.try_get::<i64, _>("size_bytes")?).unwrap_or(0),
                    price_per_gb_month: Money::from_micros(r.try_get("price_per_gb_month")?),
                    created_at: from_ts(r.try_get("created_at")?)?,
                    deleted_at: r
                        .try_get::<Option<i64>, _>("deleted_at")?
                        .map(from_ts)
                        .transpose()?,
                    amount: Money::from_micros(r.try_get("amount")?),
                })
            })
            .collect()
    }

    async fn earnings(
        &self,
        user_id: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<NodeEarnings>> {
        let rows = sqlx::query(
            "SELECT t.node_id, COALESCE(n.name, t.node_id) AS name,
                    CAST(SUM(t.amount) AS BIGINT) AS earned
             FROM transfers t LEFT JOIN nodes n ON n.id = t.node_id
             WHERE t.credit_account = $1 AND t.kind = 'earning'
               AND t.created_at >= $2 AND t.created_at < $3
             GROUP BY t.node_id, n.name ORDER BY name",
        )
        .bind(ledger::earnings_account(user_id))
        .bind(ts(from))
        .bind(ts(to))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(NodeEarnings {
                    node_id: r
                        .try_get::<Option<String>, _>("node_id")?
                        .unwrap_or_default(),
                    node: r.try_get("name")?,
                    earned: Money::from_micros(r.try_get("earned")?),
                })
            })
            .collect()
    }

    async fn usage_facts(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        telemetry: bool,
    ) -> Result<crate::UsageFacts> {
        self.read_usage_facts(from, to, telemetry).await
    }

    async fn spot_stats(&self) -> Result<SpotStats> {
        let rows = sqlx::query(
            "SELECT end_reason, COUNT(*) AS n FROM reservations
             WHERE tier = $1 AND started_at IS NOT NULL
               AND status IN ('stopped', 'failed', 'preempted', 'lost', 'expired')
             GROUP BY end_reason",
        )
        .bind(Tier::Spot.as_str())
        .fetch_all(&self.pool)
        .await?;
        let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
        for r in rows {
            let reason: Option<String> = r.try_get("end_reason")?;
            let n: i64 = r.try_get("n")?;
            *by_reason.entry(reason.unwrap_or_default()).or_default() +=
                u64::try_from(n).unwrap_or(0);
        }
        Ok(spot_stats_of(&by_reason))
    }
}

/// How spot instances ended, from the number that ran and ended for each end reason.
pub(crate) fn spot_stats_of(by_reason: &BTreeMap<String, u64>) -> SpotStats {
    let ended: u64 = by_reason.values().sum();
    let preempted = by_reason.get("preempted").copied().unwrap_or(0);
    // The platform's doing: preemption, or the node stopping it (lost, drained).
    let interrupted = preempted
        + ["stopped_by_agent", "lost"]
            .iter()
            .filter_map(|r| by_reason.get(*r))
            .sum::<u64>();
    let completed = ended - interrupted;
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let success_rate = (ended > 0).then(|| completed as f64 / ended as f64);
    SpotStats {
        ended,
        completed,
        preempted,
        interrupted,
        success_rate,
    }
}
