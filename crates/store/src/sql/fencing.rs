//! Fencing: a node not heard from for the TTL, or a GPU its agent no longer reports, is lost; the
//! work on it ends or waits to run again.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use gpurent_types::agent::GpuInfo;
use gpurent_types::{OnNodeLoss, ReservationStatus};
use sqlx::{AnyConnection, Row};

use super::endings::{finish, requeue_lost, Gone, NODE_LOST};
use super::fragments::live_statuses;
use super::nodes::adjust_pool;
use super::restarts::Requeue;
use super::{retry_conflicts, ts, SqlStore};
use crate::{Fenced, Result, StoreError};

pub(super) async fn fence_lost_nodes(
    store: &SqlStore,
    ttl: std::time::Duration,
    now: DateTime<Utc>,
) -> Result<Fenced> {
    let ttl_us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
    let at = ts(now);
    // A lost node is swept again while work is still on it: a stop or a placement that
    // won a race with its fencing left it there.
    let due = sqlx::query(concat!(
        "SELECT id, last_seen_at FROM nodes n WHERE last_seen_at < $1
               AND (status <> 'lost' OR EXISTS (
                   SELECT 1 FROM reservations r WHERE r.node_id = n.id AND r.status IN ",
        live_statuses!(),
        ")) ORDER BY id"
    ))
    .bind(at.saturating_sub(ttl_us))
    .fetch_all(&store.pool)
    .await?;
    let mut all = Fenced::default();
    for n in due {
        let id: String = n.try_get("id")?;
        let seen: i64 = n.try_get("last_seen_at")?;
        // Not waited through a failover (a read-only host): the heartbeats that could not be
        // written meanwhile would fence every node the moment a new primary answers. The
        // maintenance loop fences again once its store has answered for a node TTL.
        let done = retry_conflicts("fence_node", || {
            fence_node_once(store, &id, seen, ttl_us, at)
        })
        .await?;
        if let Some(f) = done {
            all.nodes.extend(f.nodes);
            all.rescheduled.extend(f.rescheduled);
            all.ended.extend(f.ended);
        }
    }
    Ok(all)
}

/// Fences one node not heard from since `seen` (see `NodeStore::fence_lost_nodes`). `None`
/// when it synced meanwhile (nothing of this is kept).
async fn fence_node_once(
    store: &SqlStore,
    node_id: &str,
    seen: i64,
    ttl_us: i64,
    now: i64,
) -> Result<Option<Fenced>> {
    let fence_at = seen.saturating_add(ttl_us).min(now);
    let mut tx = store.begin().await?;
    let rows = sqlx::query(&format!("{LIVE_ON} node_id = $1 ORDER BY id"))
        .bind(node_id)
        .fetch_all(&mut *tx)
        .await?;
    let mut fenced = Fenced::default();
    for r in &rows {
        lose_reservation(
            &mut tx,
            r,
            fence_at,
            now,
            &Requeue::moved(NODE_LOST, "its node was lost; waiting to run again"),
            &mut fenced,
        )
        .await?;
    }
    // Nodes last in the lock order; the compare-and-set on its last heartbeat loses to a
    // sync that came meanwhile, and then nothing of this is kept.
    let marked = sqlx::query(
        "UPDATE nodes SET status = 'lost', lost_at = COALESCE(lost_at, $1),
            desired_version = desired_version + 1
         WHERE id = $2 AND last_seen_at = $3",
    )
    .bind(fence_at)
    .bind(node_id)
    .bind(seen)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if marked != 1 {
        return Ok(None);
    }
    tx.commit().await?;
    tracing::warn!(
        node_id,
        rescheduled = fenced.rescheduled.len(),
        ended = fenced.ended.len(),
        "node lost: not heard from for the node TTL"
    );
    fenced.nodes.push(node_id.to_owned());
    Ok(Some(fenced))
}

/// A reservation whose node, or one of whose GPUs, was lost at `fence_at` (`row`: its id,
/// status, on_node_loss, started_at, duration_s, restart_policy): what had run out its hours expired, what
/// was stopping ends, what chose `stop` ends as lost, and the rest waits to run again
/// (`requeue_lost`), each noted in `fenced`.
async fn lose_reservation(
    conn: &mut AnyConnection,
    r: &sqlx::any::AnyRow,
    fence_at: i64,
    now: i64,
    requeue: &Requeue<'_>,
    fenced: &mut Fenced,
) -> Result<()> {
    let id: String = r.try_get("id")?;
    let status: ReservationStatus = r
        .try_get::<String, _>("status")?
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
    let choice: String = r.try_get("on_node_loss")?;
    let duration_us = r.try_get::<i64, _>("duration_s")?.saturating_mul(1_000_000);
    let deadline = r
        .try_get::<Option<i64>, _>("started_at")?
        .map(|s| s.saturating_add(duration_us))
        .filter(|d| *d <= fence_at);
    let end_as = match (deadline, status) {
        // Its billing already ended when the stop was asked for.
        (_, ReservationStatus::Stopping) => None,
        // Its hours were up before the fence: it expired, wherever it ran.
        (Some(deadline), _) => Some(("expired", deadline)),
        (None, _) if choice == OnNodeLoss::Stop.as_str() => Some((NODE_LOST, fence_at)),
        (None, _) => {
            if requeue_lost(conn, &id, status, fence_at, now, requeue).await? {
                fenced.rescheduled.push(id);
            }
            return Ok(());
        }
    };
    if let Some((reason, at)) = end_as {
        sqlx::query(
            "UPDATE reservations SET end_reason = $1, stop_requested_at = $2
             WHERE id = $3 AND status = $4",
        )
        .bind(reason)
        .bind(at)
        .bind(&id)
        .bind(status.as_str())
        .execute(&mut *conn)
        .await?;
    }
    // A managed job's preempted run is queued again rather than finished.
    let done = if status == ReservationStatus::Stopping {
        let policy = super::restarts::policy_of(r)?;
        super::restarts::run_ended(conn, &id, status, policy, Gone::Fenced, fence_at).await?
    } else {
        finish(conn, &id, status, Gone::Fenced, fence_at).await?
    };
    if done {
        fenced.ended.push(id);
    }
    Ok(())
}

/// The live reservations of a node (`column` = node_id) or of one GPU, as `lose_reservation`
/// reads them, in id order (the lock order).
const LIVE_ON: &str = concat!(
    "SELECT id, status, on_node_loss, started_at, duration_s, restart_policy FROM reservations
     WHERE status IN ",
    live_statuses!(),
    " AND "
);

/// GPUs of the node that its agent no longer reports (restarted with fewer, or one fell off
/// the bus and out of the driver's list) leave placement now, and the work on them is handled
/// as on a lost node; GPUs reported again come back. True when the node's desired state
/// changed.
pub(super) async fn reconcile_inventory(
    conn: &mut AnyConnection,
    node_id: &str,
    reported: &[GpuInfo],
    at: i64,
) -> Result<bool> {
    let known =
        sqlx::query("SELECT uuid, missing_since FROM gpus WHERE node_id = $1 ORDER BY uuid")
            .bind(node_id)
            .fetch_all(&mut *conn)
            .await?;
    let reported: HashSet<&str> = reported.iter().map(|g| g.uuid.as_str()).collect();
    let mut changed = false;
    let mut gone = Vec::new();
    for g in &known {
        let uuid: String = g.try_get("uuid")?;
        let missing = g.try_get::<Option<i64>, _>("missing_since")?.is_some();
        match (missing, reported.contains(uuid.as_str())) {
            (false, false) => gone.push(uuid),
            (true, true) => {
                // Back: whatever ran on it was moved, so all of it is free again.
                let row = sqlx::query(
                    "UPDATE gpus SET missing_since = NULL, free_mb = vram_mb
                     WHERE uuid = $1 AND node_id = $2 RETURNING type_key",
                )
                .bind(&uuid)
                .bind(node_id)
                .fetch_one(&mut *conn)
                .await?;
                let type_key: String = row.try_get("type_key")?;
                adjust_pool(conn, node_id, &type_key, 1).await?;
                tracing::info!(node_id, gpu = %uuid, "GPU reported again: back in placement");
                changed = true;
            }
            _ => {}
        }
    }
    if gone.is_empty() {
        return Ok(changed);
    }
    // Reservations first (the lock order), then the GPUs they gave back.
    let mut fenced = Fenced::default();
    for uuid in &gone {
        let rows = sqlx::query(&format!(
            "{LIVE_ON} id IN (SELECT reservation_id FROM allocations WHERE gpu_uuid = $1) ORDER BY id"
        ))
        .bind(uuid)
        .fetch_all(&mut *conn)
        .await?;
        for r in &rows {
            lose_reservation(
                conn,
                r,
                at,
                at,
                &Requeue::moved(
                    "gpu_lost",
                    "a GPU it ran on is gone from its node; waiting to run again",
                ),
                &mut fenced,
            )
            .await?;
        }
    }
    for uuid in &gone {
        // Out of placement: no memory free, and not counted as a whole free GPU (which it
        // was unless something it could not move, already ended, still holds it).
        let whole_free = sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM gpus WHERE uuid = $1 AND free_mb = vram_mb",
        )
        .bind(uuid)
        .fetch_one(&mut *conn)
        .await?;
        let type_key: String = sqlx::query_scalar(
            "UPDATE gpus SET missing_since = $1, free_mb = 0 WHERE uuid = $2 AND node_id = $3
             RETURNING type_key",
        )
        .bind(at)
        .bind(uuid)
        .bind(node_id)
        .fetch_one(&mut *conn)
        .await?;
        if whole_free == 1 {
            adjust_pool(conn, node_id, &type_key, -1).await?;
        }
        tracing::warn!(node_id, gpu = %uuid, rescheduled = fenced.rescheduled.len(), ended = fenced.ended.len(), "GPU no longer reported by its agent: out of placement");
    }
    Ok(true)
}
