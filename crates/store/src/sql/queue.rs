//! The queue of reservations waiting for GPUs: enqueueing, what a scheduling pass reads,
//! committing its placements by compare-and-set, and ending queued reservations.
//!
//! A queued reservation is a `pending` row with no node: its first hour is held like any
//! other's, its meter exists (and is not settled: nothing runs), and it holds no GPU memory.

use chrono::{DateTime, Utc};
use gpurent_billing::PriceList;
use gpurent_sched::queue::Reason;
use gpurent_sched::NoFit;
use gpurent_types::api::Reservation;
use gpurent_types::{Money, ReservationStatus, Tier};
use sqlx::{AnyConnection, Row};

use super::endings::PREEMPTED;
use super::fragments::unstopped_statuses;
use super::nodes::{adjust_pool, bump_version, release_gpus};
use super::reservations::{
    earlier_reservation, fetch_reservation, insert_reservation, size_of, stop_meter, take_hold,
    to_json, Attempt, Destination, NewRow,
};
use super::switch_of;
use super::{from_ts, new_id, retry_transient, ts, SqlStore};
use crate::{
    Backend, HeldWork, LiveGpu, NewReservation, QueueView, QueuedPlacement, QueuedReservation,
    Result, Scope, StoreError, Want,
};

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
    /// Records `new` as queued: no node, no GPUs, the first hour held as for a placement.
    pub(super) async fn try_enqueue(
        &self,
        new: &NewReservation,
        prices: &PriceList,
        live_since: i64,
        now: DateTime<Utc>,
    ) -> Result<Attempt> {
        let at = ts(now);
        let mut tx = self.begin().await?;
        if let Some(r) = earlier_reservation(&mut tx, new).await? {
            return Ok(Attempt::Done(Box::new(r), Vec::new()));
        }
        super::caps::lock_tenant(&mut tx, &new.tenant_id).await?;
        let key = new.gpu_type.key();
        let largest = sqlx::query(
            "SELECT MAX(vram_mb) AS vram_mb, MIN(type_name) AS type_name,
                    CAST(COALESCE(MAX(n), 0) AS BIGINT) AS most_on_one_node
             FROM gpus g JOIN (SELECT node_id, COUNT(*) AS n FROM gpus WHERE type_key = $1
                               GROUP BY node_id) c ON c.node_id = g.node_id
             WHERE g.type_key = $1",
        )
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
        let vram: Option<i64> = largest.try_get("vram_mb")?;
        let Some(vram) = vram else {
            // No GPU of the type at all: the reason says which types there are.
            return Err(self.no_capacity_reason(&mut tx, new, live_since).await?);
        };
        let type_name: String = largest.try_get("type_name")?;
        let most_on_one_node: i64 = largest.try_get("most_on_one_node")?;
        // Work that no node could ever take is refused, not queued until it times out.
        match new.want {
            Want::Whole { count } if i64::from(count) > most_on_one_node => {
                return Err(StoreError::NoCapacity(format!(
                    "asked for {count} whole {type_name} GPUs on one node; no node has more than {most_on_one_node}"
                )));
            }
            Want::Share { vram_mb } if vram_mb > mb(vram) => {
                return Err(StoreError::NoCapacity(format!(
                    "asked for {vram_mb} MiB of one {type_name} GPU; the largest has {vram} MiB"
                )));
            }
            _ => {}
        }
        let quote = prices.quote(
            &new.gpu_type,
            size_of(new.want, mb(vram)),
            new.duration_s,
            new.tier,
            new.bid,
        )?;
        let reason = match new.want {
            Want::Whole { count } => {
                let most: Option<i64> = sqlx::query_scalar(
                    "SELECT MAX(p.whole_free) FROM gpu_pools p JOIN nodes n ON n.id = p.node_id
                     WHERE p.type_key = $1 AND n.last_seen_at >= $2 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'",
                )
                .bind(key)
                .bind(live_since)
                .fetch_one(&mut *tx)
                .await?;
                NoFit::NotEnoughOnOneNode {
                    wanted: count,
                    most_on_one_node: u32::try_from(most.unwrap_or(0)).unwrap_or(0),
                }
            }
            Want::Share { vram_mb } => NoFit::NoShare { wanted_mb: vram_mb },
        };
        let reason = Reason::NoFit(reason).to_string();
        let id = new_id();
        super::caps::check_caps(&mut tx, &new.tenant_id, &new.limits, quote.price_per_hour).await?;
        take_hold(&mut tx, new, &id, quote.hold, at).await?;
        let (gpu_count, vram_mb) = match new.want {
            Want::Whole { count } => (count, None),
            Want::Share { vram_mb } => (1, Some(vram_mb)),
        };
        let row = NewRow {
            id: &id,
            new,
            type_name: &type_name,
            gpu_count,
            vram_mb,
            quote: &quote,
            host_share_bps: prices.host_share_bps,
            at,
            destination: Destination::Queued { reason: &reason },
        };
        if !insert_reservation(&mut tx, &row).await? {
            return Ok(Attempt::LostRace);
        }
        let reservation = fetch_reservation(&mut tx, &id, &Scope::All).await?;
        tx.commit().await?;
        tracing::info!(reservation_id = %id, tenant_id = %new.tenant_id, tier = %new.tier, %reason, "queued");
        Ok(Attempt::Done(Box::new(reservation), Vec::new()))
    }

    pub(super) async fn read_queue(&self, live_since: i64, now: i64) -> Result<QueueView> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(
            "SELECT id, type_key, gpu_count, vram_mb, tier, priority, queued_at, duration_s
             FROM reservations WHERE status = 'pending' AND node_id IS NULL
             ORDER BY queued_at, id",
        )
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
            queued.push(QueuedReservation {
                id: r.try_get("id")?,
                type_key,
                want: want_of(r)?,
                tier: tier_of(r)?,
                priority: r.try_get("priority")?,
                queued_at: from_ts(queued_at)?,
                duration_s: mb(r.try_get("duration_s")?),
            });
        }
        let mut gpus = Vec::new();
        let mut held: Vec<HeldWork> = Vec::new();
        for key in &keys {
            let rows = sqlx::query(
                "SELECT g.uuid, g.node_id, g.vram_mb, g.free_mb, g.switch_group FROM gpus g
                 JOIN nodes n ON n.id = g.node_id
                 WHERE g.type_key = $1 AND n.last_seen_at >= $2 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready' ORDER BY g.node_id, g.idx",
            )
            .bind(key)
            .bind(live_since)
            .fetch_all(&mut *conn)
            .await?;
            for g in &rows {
                gpus.push(LiveGpu {
                    uuid: g.try_get("uuid")?,
                    node_id: g.try_get("node_id")?,
                    type_key: key.clone(),
                    vram_mb: mb(g.try_get("vram_mb")?),
                    free_mb: mb(g.try_get("free_mb")?),
                    switch: switch_of(g)?,
                });
            }
            let rows = sqlx::query(
                "SELECT r.id, r.tier, r.priority, r.status, r.price_per_hour, r.duration_s,
                        r.started_at, COALESCE(r.placed_at, r.created_at) AS placed,
                        a.gpu_uuid, a.vram_mb
                 FROM reservations r JOIN allocations a ON a.reservation_id = r.id
                      JOIN gpus g ON g.uuid = a.gpu_uuid JOIN nodes n ON n.id = g.node_id
                 WHERE g.type_key = $1 AND n.last_seen_at >= $2 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'
                   AND r.status IN ('pending', 'starting', 'running', 'stopping')
                 ORDER BY r.id, a.gpu_uuid",
            )
            .bind(key)
            .bind(live_since)
            .fetch_all(&mut *conn)
            .await?;
            for r in &rows {
                let id: String = r.try_get("id")?;
                let hold = (r.try_get("gpu_uuid")?, mb(r.try_get("vram_mb")?));
                if let Some(last) = held.last_mut().filter(|h| h.id == id) {
                    last.holds.push(hold);
                    continue;
                }
                let status: String = r.try_get("status")?;
                let started_at: Option<i64> = r.try_get("started_at")?;
                let duration_us = r.try_get::<i64, _>("duration_s")?.saturating_mul(1_000_000);
                let stopping = status == ReservationStatus::Stopping.as_str();
                let ends_at = match (stopping, started_at) {
                    (true, _) => now,
                    (false, Some(s)) => s.saturating_add(duration_us),
                    (false, None) => now.saturating_add(duration_us),
                };
                held.push(HeldWork {
                    id,
                    tier: tier_of(r)?,
                    priority: r.try_get("priority")?,
                    stopping,
                    price_per_hour: Money::from_micros(r.try_get("price_per_hour")?),
                    since: from_ts(started_at.unwrap_or(r.try_get("placed")?))?,
                    ends_at: from_ts(ends_at)?,
                    holds: vec![hold],
                });
            }
        }
        Ok(QueueView { queued, gpus, held })
    }

    pub(super) async fn try_place_queued(
        &self,
        plan: &QueuedPlacement,
        grace_s: u64,
        now: i64,
    ) -> Result<Option<Vec<String>>> {
        let mut tx = self.begin().await?;
        let queued = sqlx::query(
            "SELECT type_key, vram_mb FROM reservations
             WHERE id = $1 AND status = 'pending' AND node_id IS NULL",
        )
        .bind(&plan.id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(queued) = queued else {
            return Ok(None);
        };
        let type_key: Option<String> = queued.try_get("type_key")?;
        let whole_only = i64::from(queued.try_get::<Option<i64>, _>("vram_mb")?.is_none());
        if self.backend == Backend::Postgres {
            // The same per-type queue as immediate placements, taken first as they do (see
            // `try_reserve`).
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                .bind(type_key.unwrap_or_default())
                .execute(&mut *tx)
                .await?;
        }
        // The claim is a compare-and-set on the row: a stop or a timeout of the same
        // reservation waits for this transaction, then finds it placed (or the other way round).
        let claimed = sqlx::query(
            "UPDATE reservations SET node_id = $1, gpus = $2, placed_at = $3, queue_reason = NULL
             WHERE id = $4 AND status = 'pending' AND node_id IS NULL",
        )
        .bind(&plan.node_id)
        .bind(to_json(
            &plan
                .gpus
                .iter()
                .map(|(u, _)| u.as_str())
                .collect::<Vec<_>>(),
        ))
        .bind(now)
        .bind(&plan.id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if claimed != 1 {
            return Ok(None);
        }
        sqlx::query("UPDATE meters SET node_id = $1 WHERE reservation_id = $2")
            .bind(&plan.node_id)
            .bind(&plan.id)
            .execute(&mut *tx)
            .await?;
        let mut woken = vec![plan.node_id.clone()];
        for victim in &plan.preempt {
            // One that ended meanwhile freed its memory anyway; the compare-and-set decides.
            if let Some(node) = preempt_reservation(&mut tx, victim, grace_s, now).await? {
                tracing::info!(reservation_id = %victim, by = %plan.id, "spot instance preempted by a queued reservation");
                if !woken.contains(&node) {
                    woken.push(node);
                }
            }
        }
        for (uuid, want) in &plan.gpus {
            let want = i64::try_from(*want).unwrap_or(i64::MAX);
            let used = sqlx::query(
                "UPDATE gpus SET free_mb = free_mb - $1
                 WHERE uuid = $2 AND node_id = $3 AND free_mb >= $1 AND ($4 = 0 OR free_mb = vram_mb)
                 RETURNING vram_mb - free_mb AS used, type_key",
            )
            .bind(want)
            .bind(uuid)
            .bind(&plan.node_id)
            .bind(whole_only)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(used) = used else {
                // A stale view: the memory went elsewhere. Nothing of this is kept.
                return Ok(None);
            };
            let key: String = used.try_get("type_key")?;
            let used: i64 = used.try_get("used")?;
            if used == want {
                adjust_pool(&mut tx, &plan.node_id, &key, -1).await?;
            }
            sqlx::query(
                "INSERT INTO allocations (reservation_id, gpu_uuid, vram_mb) VALUES ($1, $2, $3)",
            )
            .bind(&plan.id)
            .bind(uuid)
            .bind(want)
            .execute(&mut *tx)
            .await?;
        }
        woken.sort();
        for node in &woken {
            bump_version(&mut tx, node).await?;
        }
        tx.commit().await?;
        tracing::info!(reservation_id = %plan.id, node_id = %plan.node_id, "queued reservation placed");
        Ok(Some(woken))
    }

    pub(super) async fn place_queued_retrying(
        &self,
        plan: &QueuedPlacement,
        prices: &PriceList,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<String>>> {
        retry_transient("place_queued", || {
            self.try_place_queued(plan, prices.spot_grace_s, ts(now))
        })
        .await
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
             WHERE status = 'pending' AND node_id IS NULL AND queued_at <= $1 ORDER BY id",
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
