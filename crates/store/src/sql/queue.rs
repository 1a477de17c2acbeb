//! The queue of reservations waiting for GPUs: what a scheduling pass reads, why each still
//! waits, and ending queued reservations (enqueueing is in `create`, placing in `placement`).
//!
//! A queued reservation is a `pending` row with no node: its first hour is held like any
//! other's, its meter exists (and is not settled: nothing runs), and it holds no GPU memory.

use gpurent_types::api::Reservation;
use gpurent_types::{ReservationStatus, Tier};
use sqlx::{AnyConnection, Row};

use super::endings::PREEMPTED;
use super::fragments::unstopped_statuses;
use super::gpus;
use super::nodes::release_gpus;
use super::rows::{fetch_reservation, stop_meter};
use super::{from_ts, SqlStore};
use crate::{LiveGpu, QueueView, QueuedReservation, Result, Scope, StoreError, Want};

/// Preempts one spot reservation: `stopping` with `end_reason = preempted`, billing stopped
/// now, its GPU memory given back at once, and `grace_s` of notice for its agent. Its bill is
/// drawn once, when its instance is gone, as every stop's: `endings::finish` reads the reason
/// as `gpurent_billing::ending::Ending::Preempted`, billed to now. Returns its node, or `None`
/// when it was no longer live.
pub(crate) async fn preempt_reservation(
    conn: &mut AnyConnection,
    id: &str,
    grace_s: u64,
    now: i64,
) -> Result<Option<String>> {
    let node: Option<Option<String>> = sqlx::query_scalar(concat!(
        "UPDATE reservations SET status = 'stopping', end_reason = $4,
                stop_requested_at = $1, stop_grace_s = $2
             WHERE id = $3 AND node_id IS NOT NULL AND status IN ",
        unstopped_statuses!(),
        " RETURNING node_id"
    ))
    .bind(now)
    .bind(i64::try_from(grace_s).unwrap_or(i64::MAX))
    .bind(id)
    .bind(PREEMPTED)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(node) = node else {
        return Ok(None);
    };
    stop_meter(conn, id).await?;
    release_gpus(conn, id).await?;
    Ok(node)
}

/// Ends a queued reservation (`pending`, no node) with this status and reason, billed as
/// `gpurent_billing::ending::Ending::Unplaced`: nothing more is charged and its whole hold is
/// released. False when it is not queued any more (placed, or ended, meanwhile).
pub(crate) async fn end_queued(
    conn: &mut AnyConnection,
    id: &str,
    status: ReservationStatus,
    reason: &str,
    now: i64,
) -> Result<bool> {
    let tenant: Option<String> = sqlx::query_scalar(
        "UPDATE reservations SET status = $1, ended_at = $2, end_reason = $3, queue_reason = NULL
         WHERE id = $4 AND status = 'pending' AND node_id IS NULL RETURNING tenant_id",
    )
    .bind(status.as_str())
    .bind(now)
    .bind(reason)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(tenant) = tenant else {
        return Ok(false);
    };
    super::endings::end_unplaced(conn, id, &tenant, now).await?;
    tracing::info!(reservation_id = id, status = %status, reason, "queued reservation ended");
    Ok(true)
}

fn want_of(row: &sqlx::any::AnyRow) -> Result<Want> {
    let vram_mb: Option<i64> = row.try_get("vram_mb")?;
    let count: i64 = row.try_get("gpu_count")?;
    Ok(match vram_mb {
        Some(mb) => Want::Share {
            vram_mb: u64::try_from(mb).unwrap_or(0),
        },
        None => Want::Whole {
            count: u32::try_from(count).unwrap_or(u32::MAX),
        },
    })
}

fn tier_of(row: &sqlx::any::AnyRow) -> Result<Tier> {
    let tier: String = row.try_get("tier")?;
    tier.parse::<Tier>()
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn mb(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl SqlStore {
    pub(super) async fn read_queue(&self, live_since: i64, now: i64) -> Result<QueueView> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(
            "SELECT r.id, r.type_key, r.gpu_count, r.vram_mb, r.tier, r.priority, r.queued_at,
                r.duration_s, r.volumes, r.tenant_id
             FROM reservations r
             WHERE r.status = 'pending' AND r.node_id IS NULL
                AND (r.retry_at IS NULL OR r.retry_at <= $1)
             ORDER BY r.queued_at, r.id",
        )
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        if rows.is_empty() {
            return Ok(QueueView::default());
        }
        let mut queued = Vec::with_capacity(rows.len());
        let mut keys: Vec<String> = Vec::new();
        for r in &rows {
            let type_key: Option<String> = r.try_get("type_key")?;
            let queued_at: Option<i64> = r.try_get("queued_at")?;
            let (Some(type_key), Some(queued_at)) = (type_key, queued_at) else {
                continue;
            };
            if !keys.contains(&type_key) {
                keys.push(type_key.clone());
            }
            let mounts: Vec<crate::VolumeMountRow> =
                serde_json::from_str(&r.try_get::<String, _>("volumes")?)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            // Two nodes' local volumes were refused when it was made.
            let node_filter =
                crate::NodeFilter::of(mounts.iter().map(|m| (m.kind, m.node_id.as_deref())))
                    .map_err(StoreError::Corrupt)?;
            queued.push(QueuedReservation {
                id: r.try_get("id")?,
                type_key,
                want: want_of(r)?,
                tier: tier_of(r)?,
                priority: r.try_get("priority")?,
                queued_at: from_ts(queued_at)?,
                duration_s: mb(r.try_get("duration_s")?),
                tie: match &node_filter {
                    crate::NodeFilter::Node(node) => match crate::VolumeTie::of(&mounts) {
                        Some(mut tie) => {
                            tie.node_down =
                                super::volume_mounts::node_down(&mut conn, node, live_since)
                                    .await?;
                            Some(tie)
                        }
                        None => None,
                    },
                    _ => None,
                },
                node_filter,
                tenant_id: r.try_get("tenant_id")?,
            });
        }
        let mut gpus = Vec::new();
        let mut held = Vec::new();
        for key in &keys {
            gpus.extend(
                gpus::live_of_type(&mut conn, key, live_since)
                    .await?
                    .into_iter()
                    .map(|gpu| LiveGpu {
                        type_key: key.clone(),
                        gpu,
                    }),
            );
            held.extend(gpus::held_on_type(&mut conn, key, live_since, now).await?);
        }
        let shared_volume_nodes = if queued
            .iter()
            .any(|q| q.node_filter == crate::NodeFilter::SharedVolumes)
        {
            super::volume_mounts::shared_nodes(&mut conn).await?
        } else {
            Vec::new()
        };
        let usage = queued_tenants_usage(&mut conn, now).await?;
        let quotas = super::quotas::queued_quotas(&mut conn).await?;
        let mut borrowed = Vec::new();
        if !quotas.is_empty() {
            for key in &keys {
                borrowed.extend(super::quotas::borrowed_of_type(&mut conn, key).await?);
            }
        }
        Ok(QueueView {
            queued,
            gpus,
            held,
            shared_volume_nodes,
            teams: usage,
            quotas,
            borrowed,
        })
    }

    pub(super) async fn write_queue_reasons(&self, reasons: &[(String, String)]) -> Result<()> {
        if reasons.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        let mut sorted: Vec<&(String, String)> = reasons.iter().collect();
        sorted.sort();
        for (id, reason) in sorted {
            sqlx::query(
                "UPDATE reservations SET queue_reason = $1
                 WHERE id = $2 AND status = 'pending' AND node_id IS NULL
                   AND (queue_reason IS NULL OR queue_reason <> $1)",
            )
            .bind(reason)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn end_timed_out(&self, queued_before: i64, now: i64) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let due: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM reservations
             WHERE status = 'pending' AND node_id IS NULL AND queued_at <= $1
                AND restart_policy = 'never' AND array_id IS NULL ORDER BY id",
        )
        .bind(queued_before)
        .fetch_all(&mut *tx)
        .await?;
        let mut ended = Vec::with_capacity(due.len());
        for id in due {
            if end_queued(
                &mut tx,
                &id,
                ReservationStatus::Failed,
                "queue_timeout",
                now,
            )
            .await?
            {
                ended.push(id);
            }
        }
        tx.commit().await?;
        Ok(ended)
    }

    /// Stops a queued reservation at its tenant's request: `stopped`, hold released. `None`
    /// when it is not queued.
    pub(super) async fn stop_queued(
        &self,
        conn: &mut AnyConnection,
        id: &str,
        scope: &Scope,
        now: i64,
    ) -> Result<Option<Reservation>> {
        if !end_queued(conn, id, ReservationStatus::Stopped, "stopped_by_user", now).await? {
            return Ok(None);
        }
        Ok(Some(fetch_reservation(conn, id, scope).await?))
    }
}

/// What fair share needs at `now` (microseconds) of each tenant with queued work: its quotas'
/// guaranteed GPUs, and its reservations that ran within the horizon, a share counted as its
/// fraction of its type's largest card. Two reads, however many tenants wait.
async fn queued_tenants_usage(
    conn: &mut sqlx::AnyConnection,
    now: i64,
) -> Result<Vec<crate::TeamUsage>> {
    const QUEUED: &str =
        "SELECT DISTINCT tenant_id FROM reservations WHERE status = 'pending' AND node_id IS NULL";
    let since = now.saturating_sub(crate::model::USAGE_HORIZON_DAYS * 86_400 * 1_000_000);
    let mut by_tenant: std::collections::BTreeMap<String, crate::TeamUsage> =
        std::collections::BTreeMap::new();
    let guaranteed = sqlx::query(&format!(
        "SELECT q.tenant_id, CAST(SUM(q.guaranteed) AS BIGINT) AS guaranteed FROM quotas q
         WHERE q.tenant_id IN ({QUEUED}) GROUP BY q.tenant_id"
    ))
    .fetch_all(&mut *conn)
    .await?;
    for r in guaranteed {
        let tenant: String = r.try_get("tenant_id")?;
        by_tenant
            .entry(tenant.clone())
            .or_default()
            .guaranteed_milli = u64::try_from(r.try_get::<i64, _>("guaranteed")?).unwrap_or(0);
    }
    // Two index searches: what runs (by tenant and status) and what ended lately (by tenant
    // and end), never a tenant's whole history.
    let micro = "CAST(CASE WHEN r.vram_mb IS NULL
                    THEN r.gpu_count * 1000000
                    ELSE r.vram_mb * 1000000 / COALESCE(
                        (SELECT MAX(g.vram_mb) FROM gpus g WHERE g.type_key = r.type_key),
                        r.vram_mb)
                END AS BIGINT) AS micro";
    let rows = sqlx::query(&format!(
        "SELECT r.tenant_id, r.started_at, r.ended_at, {micro}
         FROM reservations r
         WHERE r.tenant_id IN ({QUEUED}) AND r.status IN ('starting', 'running', 'stopping')
           AND r.started_at IS NOT NULL AND r.ended_at IS NULL
         UNION ALL
         SELECT r.tenant_id, r.started_at, r.ended_at, {micro}
         FROM reservations r
         WHERE r.tenant_id IN ({QUEUED}) AND r.ended_at IS NOT NULL AND r.ended_at >= $1
           AND r.started_at IS NOT NULL"
    ))
    .bind(since)
    .fetch_all(&mut *conn)
    .await?;
    let secs = |us: i64| us.div_euclid(1_000_000);
    for r in rows {
        let tenant: String = r.try_get("tenant_id")?;
        by_tenant
            .entry(tenant)
            .or_default()
            .ran
            .push(gpurent_sched::fair_share::Interval {
                micro_gpus: u64::try_from(r.try_get::<i64, _>("micro")?).unwrap_or(0),
                start_s: secs(r.try_get("started_at")?),
                end_s: r.try_get::<Option<i64>, _>("ended_at")?.map(secs),
            });
    }
    Ok(by_tenant
        .into_iter()
        .map(|(team_id, usage)| crate::TeamUsage { team_id, ..usage })
        .collect())
}
