//! The facts of the usage reports: reservations that held GPUs or moved money in a window,
//! the fleet's GPUs, and the telemetry rollup.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use gpurent_types::{Money, ReservationStatus, Tier};
use sqlx::Row;

use super::{from_ts, gpu_hours, ts, SqlStore};
use crate::usage_facts::{FleetGpu, UsageFacts, UsedReservation};
use crate::{Result, StoreError};

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl SqlStore {
    pub(crate) async fn read_usage_facts(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        telemetry: bool,
    ) -> Result<UsageFacts> {
        let (from, to) = (ts(from), ts(to));
        // The charges of the window, per reservation, and the hosts' earnings per node (paid
        // per node at each settlement, per reservation at its end). No index on
        // transfers.created_at: it would cost every settlement a write, for a report an admin
        // runs once a day.
        let mut charged: HashMap<String, i64> = HashMap::new();
        let mut node_earnings = Vec::new();
        for row in sqlx::query(
            "SELECT kind, CASE WHEN kind = 'charge' THEN reservation_id ELSE node_id END AS owner,
                    CAST(SUM(amount) AS BIGINT) AS amount FROM transfers
             WHERE kind IN ('charge', 'earning') AND created_at >= $1 AND created_at < $2
             GROUP BY kind, CASE WHEN kind = 'charge' THEN reservation_id ELSE node_id END",
        )
        .bind(from)
        .bind(to)
        .fetch_all(&self.pool)
        .await?
        {
            let kind: String = row.try_get("kind")?;
            let Some(owner) = row.try_get::<Option<String>, _>("owner")? else {
                continue;
            };
            let amount: i64 = row.try_get("amount")?;
            if kind == "charge" {
                charged.insert(owner, amount);
            } else {
                node_earnings.push((owner, Money::from_micros(amount)));
            }
        }
        node_earnings.sort();
        // Billing ends at the stop (or preemption, expiry, fence) that was asked for, else when
        // the instance ended by itself.
        let rows = sqlx::query(
            "SELECT r.id, r.tenant_id, u.name AS tenant, u.kind AS tenant_kind,
                    m.name AS made_by, r.node_id, n.name AS node, r.gpus,
                    r.vram_mb, r.tier, r.status, r.end_reason, r.started_at,
                    r.host_share_bps,
                    COALESCE(r.stop_requested_at, r.ended_at) AS billed_until
             FROM reservations r JOIN users u ON u.id = r.tenant_id
             LEFT JOIN users m ON m.id = r.created_by AND u.kind = 'team'
             LEFT JOIN nodes n ON n.id = r.node_id
             WHERE (r.started_at IS NOT NULL AND r.started_at < $2
                    AND COALESCE(r.stop_requested_at, r.ended_at, $2) > $1)
                OR r.id IN (SELECT reservation_id FROM transfers
                            WHERE kind = 'charge' AND created_at >= $1 AND created_at < $2)
             ORDER BY r.id",
        )
        .bind(from)
        .bind(to)
        .fetch_all(&self.pool)
        .await?;
        let mut reservations = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: String = r.try_get("id")?;
            let charged = charged.get(&id).copied().unwrap_or_default();
            let opt_ts = |col: &str| -> Result<Option<DateTime<Utc>>> {
                r.try_get::<Option<i64>, _>(col)?.map(from_ts).transpose()
            };
            reservations.push(UsedReservation {
                tenant_id: r.try_get("tenant_id")?,
                tenant: r.try_get("tenant")?,
                team: r.try_get::<String, _>("tenant_kind")? == "team",
                made_by: r.try_get("made_by")?,
                node_id: r.try_get("node_id")?,
                node: r.try_get("node")?,
                gpus: serde_json::from_str(&r.try_get::<String, _>("gpus")?).map_err(corrupt)?,
                share_mb: r.try_get("vram_mb")?,
                tier: r
                    .try_get::<String, _>("tier")?
                    .parse::<Tier>()
                    .map_err(corrupt)?,
                status: r
                    .try_get::<String, _>("status")?
                    .parse::<ReservationStatus>()
                    .map_err(corrupt)?,
                end_reason: r.try_get("end_reason")?,
                started_at: opt_ts("started_at")?,
                ended_at: opt_ts("billed_until")?,
                charged: Money::from_micros(charged),
                host_share_bps: u32::try_from(r.try_get::<i64, _>("host_share_bps")?)
                    .map_err(corrupt)?,
                id,
            });
        }
        reservations.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        let gpus = sqlx::query(
            "SELECT g.uuid, g.node_id, n.name AS node, g.idx, g.type_name, g.vram_mb
             FROM gpus g JOIN nodes n ON n.id = g.node_id ORDER BY n.name, g.idx",
        )
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|g| {
            Ok(FleetGpu {
                uuid: g.try_get("uuid")?,
                node_id: g.try_get("node_id")?,
                node: g.try_get("node")?,
                index: u32::try_from(g.try_get::<i64, _>("idx")?).map_err(corrupt)?,
                model: g.try_get("type_name")?,
                vram_mb: g.try_get("vram_mb")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
        let hours = if telemetry {
            self.flush_gpu_hours().await?;
            gpu_hours::read(&self.pool, gpu_hours::hour_of(from), to).await?
        } else {
            Vec::new()
        };
        Ok(UsageFacts {
            reservations,
            gpus,
            hours,
            node_earnings,
        })
    }
}
