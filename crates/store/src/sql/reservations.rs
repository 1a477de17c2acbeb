//! Offers and the reservation lifecycle after placement: reading, stop, expiry, idle
//! reclaim; `reserve` and the queue's placements are applied in `placement`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_billing::{PriceList, Size};
use gpurent_sched::{Plan, Request};
use gpurent_types::api::{Offer, Reservation, ReservedDiscount};
use gpurent_types::{GpuType, ReservationStatus, RestartPolicy};
use sqlx::Row;

use super::endings::PREEMPTED;
use super::gpus::placeable;
use super::nodes::bump_version;
use super::rows::{
    fetch_reservation, reservation_from_row, scope_param, seen_tenants, stop_meter,
    RESERVATION_COLUMNS,
};
use super::{gib, retry_transient, ts, SqlStore};
use crate::{NewReservation, RecordWithin, ReservationStore, Reserved, Result, Scope, StoreError};

/// Times a stop is tried when the reservation's status moves under it.
const STOP_TRIES: usize = 5;

#[async_trait]
impl ReservationStore for SqlStore {
    async fn offers(&self, prices: &PriceList, live_since: DateTime<Utc>) -> Result<Vec<Offer>> {
        let rows = sqlx::query(concat!(
            "SELECT g.type_name, g.type_key, MAX(g.vram_mb) AS vram_mb,
                    CAST(SUM(CASE WHEN g.free_mb = g.vram_mb AND ",
            placeable!("$1"),
            " THEN 1 ELSE 0 END) AS BIGINT) AS available,
                    CAST(SUM(CASE WHEN g.free_mb = g.vram_mb AND ",
            placeable!("$1"),
            " AND n.isolated = 0 THEN 1 ELSE 0 END) AS BIGINT) AS unisolated,
                    CAST(SUM(CASE WHEN g.free_mb = g.vram_mb AND ",
            placeable!("$1"),
            " AND n.shared_network = 1 THEN 1 ELSE 0 END) AS BIGINT) AS shared_network
             FROM gpus g JOIN nodes n ON n.id = g.node_id
             GROUP BY g.type_name, g.type_key ORDER BY g.type_name"
        ))
        .bind(ts(live_since))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let name: String = r.try_get("type_name")?;
                let vram_mb: i64 = r.try_get("vram_mb")?;
                let gpu_vram_mb = u64::try_from(vram_mb).unwrap_or(0);
                let gpu_type = GpuType::from_driver_name(&name);
                let one = Size::Whole {
                    count: 1,
                    gpu_vram_mb,
                };
                let stepped = prices.stepped_rate(&gpu_type, one)?;
                Ok(Offer {
                    vram_gb: gib(vram_mb),
                    vram_mb: gpu_vram_mb,
                    available: u32::try_from(r.try_get::<i64, _>("available")?).unwrap_or(0),
                    unisolated: u32::try_from(r.try_get::<i64, _>("unisolated")?).unwrap_or(0),
                    shared_network: u32::try_from(r.try_get::<i64, _>("shared_network")?)
                        .unwrap_or(0),
                    price_per_hour: prices.on_demand_per_hour(&gpu_type, one)?,
                    spot_min_bid: prices.spot_min_bid(&gpu_type, one)?,
                    stepped_price_per_hour: stepped.first,
                    stepped_first_hours: u32::try_from(stepped.step_s / 3600).unwrap_or(u32::MAX),
                    stepped_then_per_hour: stepped.then,
                    share_price_per_gb_hour: prices.on_demand_per_hour(
                        &gpu_type,
                        Size::Share {
                            vram_mb: 1024,
                            gpu_vram_mb,
                        },
                    )?,
                    reserved_discounts: prices
                        .reserved_prices(&gpu_type, one)?
                        .into_iter()
                        .map(|(min_hours, percent, price_per_hour)| ReservedDiscount {
                            min_hours,
                            percent,
                            price_per_hour,
                        })
                        .collect(),
                    currency: prices.currency().to_owned(),
                    gpu_type: name,
                })
            })
            .collect()
    }

    async fn gpu_vram_mb(&self, gpu_type: &GpuType) -> Result<Option<u64>> {
        let vram: Option<i64> =
            sqlx::query_scalar("SELECT MAX(vram_mb) FROM gpus WHERE type_key = $1")
                .bind(gpu_type.key())
                .fetch_one(&self.pool)
                .await?;
        Ok(vram.and_then(|v| u64::try_from(v).ok()))
    }

    async fn reserve(
        &self,
        new: NewReservation,
        prices: &PriceList,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
        expected: &[Request],
    ) -> Result<(Reservation, Vec<String>)> {
        let reserved = self
            .reserve_combined(new, prices, ts(live_since), now, expected, None)
            .await?;
        Ok((reserved.reservation, reserved.nodes))
    }

    async fn reserve_recorded(
        &self,
        new: NewReservation,
        prices: &PriceList,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
        expected: &[Request],
        record: RecordWithin,
    ) -> Result<Reserved> {
        self.reserve_combined(new, prices, ts(live_since), now, expected, Some(record))
            .await
    }

    async fn get_reservation(&self, id: &str, scope: &Scope) -> Result<Reservation> {
        let mut conn = self.pool.acquire().await?;
        fetch_reservation(&mut conn, id, scope).await
    }

    async fn list_reservations(
        &self,
        scope: &Scope,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Vec<Reservation>> {
        // Newest first; the cursor is the last reservation of the previous page, looked up in
        // the caller's scope: another tenant's id answers an empty page, as an unknown one, so
        // a cursor cannot probe which ids exist.
        let seen = seen_tenants(1);
        sqlx::query(&format!(
            "SELECT {RESERVATION_COLUMNS} WHERE ($1 = '' OR r.tenant_id IN {seen})
               AND r.array_id IS NULL
               AND ($2 = '' OR r.created_at < (SELECT c.created_at FROM reservations c
                                               WHERE c.id = $2 AND ($1 = '' OR c.tenant_id IN {seen}))
                    OR (r.created_at = (SELECT c.created_at FROM reservations c
                                        WHERE c.id = $2 AND ($1 = '' OR c.tenant_id IN {seen}))
                        AND r.id > $2))
             ORDER BY r.created_at DESC, r.id LIMIT $3"
        ))
        .bind(scope_param(scope))
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit.min(1000)))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(reservation_from_row)
        .collect()
    }

    async fn read_logs(
        &self,
        id: &str,
        scope: &Scope,
        offset: u64,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, u64)> {
        let mut conn = self.pool.acquire().await?;
        fetch_reservation(&mut conn, id, scope).await?;
        super::logs::read(&mut conn, id, offset, max_bytes).await
    }

    async fn append_log_note(&self, reservation_id: &str, line: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        super::logs::note(&mut tx, reservation_id, line).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn prune_logs(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut tx = self.begin().await?;
        let pruned = super::logs::prune(&mut tx, ts(before)).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn request_stop(
        &self,
        id: &str,
        scope: &Scope,
        now: DateTime<Utc>,
    ) -> Result<(Reservation, Option<String>)> {
        self.stop_with_reason(id, scope, now, "stopped_by_user")
            .await
    }

    async fn expire_due(&self, now: DateTime<Utc>) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let due = sqlx::query(
            "SELECT id, node_id FROM reservations
             WHERE status = 'running' AND started_at + duration_s * 1000000 <= $1 ORDER BY id",
        )
        .bind(ts(now))
        .fetch_all(&mut *tx)
        .await?;
        let mut nodes = Vec::new();
        for row in due {
            let id: String = row.try_get("id")?;
            let node: Option<String> = row.try_get("node_id")?;
            sqlx::query(
                "UPDATE reservations SET status = 'stopping', end_reason = 'expired',
                    stop_requested_at = started_at + duration_s * 1000000
                 WHERE id = $1 AND status = 'running'",
            )
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            stop_meter(&mut tx, &id).await?;
            tracing::info!(reservation_id = %id, "reservation expired");
            if let Some(node) = node {
                if !nodes.contains(&node) {
                    nodes.push(node);
                }
            }
        }
        // Nodes last, as in every transaction (see `sync_once`).
        nodes.sort();
        for node in &nodes {
            bump_version(&mut tx, node).await?;
        }
        tx.commit().await?;
        Ok(nodes)
    }

    async fn touch_reservation(&self, id: &str, at: DateTime<Utc>) -> Result<()> {
        sqlx::query(
            "UPDATE reservations SET last_active_at = $2
             WHERE id = $1 AND status = 'running'
               AND (last_active_at IS NULL OR last_active_at < $2)",
        )
        .bind(id)
        .bind(ts(at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn reclaim_idle(
        &self,
        idle_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let due = sqlx::query(
            "SELECT id, node_id FROM reservations
             WHERE status = 'running' AND idle_reclaim <> 0
               AND CASE WHEN last_active_at IS NULL OR last_active_at < started_at
                        THEN started_at ELSE last_active_at END <= $1
             ORDER BY id",
        )
        .bind(ts(idle_since))
        .fetch_all(&mut *tx)
        .await?;
        let mut nodes = Vec::new();
        for row in due {
            let id: String = row.try_get("id")?;
            let node: Option<String> = row.try_get("node_id")?;
            let stopped = sqlx::query(
                "UPDATE reservations SET status = 'stopping', end_reason = 'idle',
                    stop_requested_at = $1
                 WHERE id = $2 AND status = 'running'",
            )
            .bind(ts(now))
            .bind(&id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if stopped == 0 {
                continue;
            }
            stop_meter(&mut tx, &id).await?;
            tracing::info!(reservation_id = %id, "reservation stopped: its GPUs were idle");
            if let Some(node) = node {
                if !nodes.contains(&node) {
                    nodes.push(node);
                }
            }
        }
        // Nodes last, as in every transaction (see `sync_once`).
        nodes.sort();
        for node in &nodes {
            bump_version(&mut tx, node).await?;
        }
        tx.commit().await?;
        Ok(nodes)
    }

    async fn settle_due(
        &self,
        now: DateTime<Utc>,
        period: std::time::Duration,
    ) -> Result<crate::Settled> {
        SqlStore::settle_due(self, now, period).await
    }

    async fn queue_view(
        &self,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<crate::QueueView> {
        self.read_queue(ts(live_since), ts(now)).await
    }

    async fn place_queued(
        &self,
        id: &str,
        plan: &Plan,
        prices: &PriceList,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<String>>> {
        self.place_queued_planned(id, plan, prices, now).await
    }

    async fn note_queue_reasons(&self, reasons: &[(String, String)]) -> Result<()> {
        retry_transient("note_queue_reasons", || self.write_queue_reasons(reasons)).await
    }

    async fn end_queue_timeouts(
        &self,
        queued_before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>> {
        retry_transient("end_queue_timeouts", || {
            self.end_timed_out(ts(queued_before), ts(now))
        })
        .await
    }

    async fn allocation_problems(&self) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        let gpus = sqlx::query(
            // A missing GPU has nothing free and should have nothing allocated.
            "SELECT g.uuid, CASE WHEN g.missing_since IS NULL THEN g.vram_mb - g.free_mb
                    ELSE g.free_mb END AS used,
                    CAST(COALESCE((SELECT SUM(a.vram_mb) FROM allocations a WHERE a.gpu_uuid = g.uuid), 0)
                         AS BIGINT) AS allocated
             FROM gpus g",
        )
        .fetch_all(&self.pool)
        .await?;
        for g in gpus {
            let used: i64 = g.try_get("used")?;
            let allocated: i64 = g.try_get("allocated")?;
            if used != allocated {
                let uuid: String = g.try_get("uuid")?;
                problems.push(format!(
                    "GPU {uuid}: {used} MiB taken but {allocated} MiB allocated"
                ));
            }
        }
        let pools = sqlx::query(
            "SELECT p.node_id, p.type_key, p.whole_free,
                    (SELECT COUNT(*) FROM gpus g WHERE g.node_id = p.node_id
                        AND g.type_key = p.type_key AND g.free_mb = g.vram_mb) AS counted
             FROM gpu_pools p",
        )
        .fetch_all(&self.pool)
        .await?;
        for p in pools {
            let (cached, counted): (i64, i64) = (p.try_get("whole_free")?, p.try_get("counted")?);
            if cached != counted {
                let node: String = p.try_get("node_id")?;
                let key: String = p.try_get("type_key")?;
                problems.push(format!(
                    "node {node}: {cached} whole free {key} GPUs recorded, {counted} counted"
                ));
            }
        }
        let orphans: Vec<String> = sqlx::query_scalar(
            "SELECT a.reservation_id FROM allocations a JOIN reservations r ON r.id = a.reservation_id
             WHERE r.status IN ('stopped', 'failed', 'preempted', 'lost', 'expired')",
        )
        .fetch_all(&self.pool)
        .await?;
        problems.extend(
            orphans
                .into_iter()
                .map(|id| format!("ended reservation {id} still holds GPUs")),
        );
        let unplaced: Vec<String> = sqlx::query_scalar(
            "SELECT r.id FROM reservations r
             WHERE r.status IN ('pending', 'starting', 'running', 'stopping')
               AND NOT (r.status = 'stopping' AND r.end_reason = 'preempted')
               AND NOT (r.status = 'pending' AND r.node_id IS NULL)
               AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.reservation_id = r.id)",
        )
        .fetch_all(&self.pool)
        .await?;
        problems.extend(
            unplaced
                .into_iter()
                .map(|id| format!("live reservation {id} holds no GPU")),
        );
        problems.extend(super::quota_use::problems(&self.pool).await?);
        Ok(problems)
    }
}

impl SqlStore {
    /// `request_stop` with the end reason it records (`stopped_by_user`, `budget`), unless the
    /// reservation's hours were up when it was asked (`expired`).
    pub(super) async fn stop_with_reason(
        &self,
        id: &str,
        scope: &Scope,
        now: DateTime<Utc>,
        reason: &str,
    ) -> Result<(Reservation, Option<String>)> {
        // The stop is a compare-and-set on the status it read: when the status moved in
        // between (its agent reported it running), it is read and tried again, never answered
        // with a stop that did nothing.
        for _ in 0..STOP_TRIES {
            let mut tx = self.begin().await?;
            let current = fetch_reservation(&mut tx, id, scope).await?;
            // A managed job stopped during its preemption's notice ends with this stop rather
            // than run again; its billing ended at the preemption.
            if current.status == ReservationStatus::Stopping
                && current.restart != RestartPolicy::Never
                && current.end_reason.as_deref() == Some(PREEMPTED)
            {
                sqlx::query(
                    "UPDATE reservations SET end_reason = $1
                     WHERE id = $2 AND status = 'stopping' AND end_reason = $3",
                )
                .bind(reason)
                .bind(id)
                .bind(PREEMPTED)
                .execute(&mut *tx)
                .await?;
                let updated = fetch_reservation(&mut tx, id, scope).await?;
                tx.commit().await?;
                return Ok((updated, None));
            }
            let stoppable = matches!(
                current.status,
                ReservationStatus::Pending
                    | ReservationStatus::Starting
                    | ReservationStatus::Running
            );
            if !stoppable {
                return Ok((current, None));
            }
            // A queued reservation has nothing to stop: it ends here, its hold released.
            if current.status == ReservationStatus::Pending && current.node.is_none() {
                if let Some(ended) = self.stop_queued(&mut tx, id, scope, ts(now)).await? {
                    tx.commit().await?;
                    return Ok((ended, None));
                }
            }
            // A stop asked after the reservation's hours were up (before the expiry pass got
            // to it) is its expiry.
            let stopped: Option<Option<String>> = sqlx::query_scalar::<_, Option<String>>(
                "UPDATE reservations SET status = 'stopping',
                    end_reason = CASE WHEN started_at + duration_s * 1000000 <= $1
                        THEN 'expired' ELSE $4 END,
                    stop_requested_at = CASE WHEN started_at + duration_s * 1000000 <= $1
                        THEN started_at + duration_s * 1000000 ELSE $1 END
                 WHERE id = $2 AND status = $3 RETURNING node_id",
            )
            .bind(ts(now))
            .bind(id)
            .bind(current.status.as_str())
            .bind(reason)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(node_id) = stopped else {
                // Its status changed since it was read: nothing was written; read it again.
                continue;
            };
            stop_meter(&mut tx, id).await?;
            if let Some(node) = &node_id {
                bump_version(&mut tx, node).await?;
            }
            let updated = fetch_reservation(&mut tx, id, scope).await?;
            tx.commit().await?;
            return Ok((updated, node_id));
        }
        Err(StoreError::Conflict(format!(
            "reservation {id} kept changing while it was being stopped; try again"
        )))
    }
}
