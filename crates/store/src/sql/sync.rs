//! A node's heartbeat (sync): its instances' reports, logs, events and telemetry applied in one
//! transaction, and the desired state it reads back.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use gpurent_types::agent::{
    AgentEvent, Assignment, GpuInfo, InstanceReport, InstanceState, LogChunk, SyncRequest,
};
use gpurent_types::ReservationStatus;
use sqlx::{AnyConnection, Row};

use super::endings::Gone;
use super::fencing::reconcile_inventory;
use super::fragments::live_statuses;
use super::nodes::insert_gpus;
use super::{retry_transient, ts, SqlStore};
use crate::{Backend, Result, StoreError, Synced};

/// The node's (parameter `$node`) version and health and its live reservations beside them
/// (none: one row of NULLs), in one statement, so one snapshot.
macro_rules! desired_select {
    ($node:literal) => {
        concat!(
            "SELECT n.desired_version, n.health, r.id, r.status, r.epoch, r.gpus, r.vram_mb,
                    r.image, r.command, r.env, r.log_read, r.ports, r.stop_grace_s, r.checkpoint,
                    r.secrets, r.volumes, r.array_index
             FROM nodes n LEFT JOIN reservations r ON r.node_id = n.id AND r.status IN ",
            live_statuses!(),
            " WHERE n.id = ",
            $node,
            " ORDER BY r.created_at, r.id"
        )
    };
}

pub(super) async fn sync_node(
    store: &SqlStore,
    node_id: &str,
    report: &SyncRequest,
    now: DateTime<Utc>,
) -> Result<Synced> {
    // Most syncs of a fleet are an idle node's heartbeat: on PostgreSQL one statement.
    let synced = if store.backend == Backend::Postgres && heartbeat_only(report) {
        retry_transient("sync_node", || heartbeat(store, node_id, report, now)).await?
    } else {
        retry_transient("sync_node", || sync_once(store, node_id, report, now)).await?
    };
    // The samples go to the hour's rollup once the sync is recorded (written a minute at a
    // time for the whole fleet, `gpu_hours`).
    if let Some(t) = &report.telemetry {
        store.gpu_hours.add(node_id, &t.gpus, ts(now));
    }
    Ok(synced)
}

/// A sync that says only that the node is alive and how its GPUs are: no reports, logs,
/// events or inventory, and no GPU busy (idle reclaim's clock has nothing to mark).
fn heartbeat_only(report: &SyncRequest) -> bool {
    report.instances.is_empty()
        && report.logs.is_empty()
        && report.events.is_empty()
        && report.gpus.is_empty()
        && report.host.is_none()
        && report
            .telemetry
            .as_ref()
            .is_none_or(|t| busy(&t.gpus).is_empty())
}

/// The node's row and the answer's desired state in one statement, with no transaction to
/// begin or commit: what `sync_once` and `desired_state` do for such a sync, in one round trip
/// instead of five.
async fn heartbeat(
    store: &SqlStore,
    node_id: &str,
    report: &SyncRequest,
    now: DateTime<Utc>,
) -> Result<Synced> {
    let at = ts(now);
    // The write as a CTE, which PostgreSQL runs to completion though nothing reads it, and the
    // answer's read in the statement's snapshot: the version it says is the one of the
    // assignments beside it (the write's RETURNING could see a placement committed since).
    let due = store.samples.due(node_id, report.telemetry.as_ref(), at);
    let q = sqlx::query(&HEARTBEAT)
        .bind(at)
        .bind(0_i64)
        .bind(node_id)
        .bind(due.as_ref().map(|d| d.json.as_str()));
    let rows = q.fetch_all(&store.pool).await?;
    if let Some(due) = &due {
        store.samples.written(node_id, due, at);
    }
    let (desired_version, health, assignments) = desired_of(&rows, node_id)?;
    Ok(Synced {
        desired_version,
        health,
        desired_state: Some((desired_version, assignments)),
    })
}

/// Rows are locked in one order in every transaction (reservations, accounts, gpus,
/// gpu_pools, nodes last) so that concurrent transactions cannot deadlock each other.
async fn sync_once(
    store: &SqlStore,
    node_id: &str,
    report: &SyncRequest,
    now: DateTime<Utc>,
) -> Result<Synced> {
    let at = ts(now);
    let gpus = &report.gpus;
    let mut tx = store.begin().await?;
    // Reservation rows in id order (see above): each one's output, its agent's events (their
    // lines land after the output and before its end), then its report.
    type Of<'a> = (
        Vec<&'a LogChunk>,
        Vec<&'a InstanceReport>,
        Vec<&'a AgentEvent>,
    );
    let mut by_reservation: BTreeMap<&str, Of<'_>> = BTreeMap::new();
    let mut node_events = Vec::new();
    for event in &report.events {
        match &event.reservation_id {
            Some(id) => by_reservation.entry(id).or_default().2.push(event),
            None => node_events.push(event),
        }
    }
    for chunk in &report.logs {
        by_reservation
            .entry(&chunk.reservation_id)
            .or_default()
            .0
            .push(chunk);
    }
    for instance in &report.instances {
        by_reservation
            .entry(&instance.reservation_id)
            .or_default()
            .1
            .push(instance);
    }
    let mut changed = false;
    for (chunks, reports, events) in by_reservation.values() {
        for chunk in chunks {
            super::logs::append(&mut tx, node_id, chunk).await?;
        }
        for event in events {
            super::agent_events::record(&mut tx, node_id, event, at).await?;
        }
        for report in reports {
            changed |= apply_report(&mut tx, node_id, report, at).await?;
        }
    }
    for event in node_events {
        super::agent_events::record(&mut tx, node_id, event, at).await?;
    }
    if let Some(t) = &report.telemetry {
        mark_active(&mut tx, node_id, &t.gpus, at).await?;
    }
    // The whole inventory comes with the first sync after the agent starts (with its host
    // facts); later syncs leave it out.
    if !gpus.is_empty() || report.host.is_some() {
        changed |= reconcile_inventory(&mut tx, node_id, gpus, at).await?;
    }
    // Most syncs carry no inventory: nothing to add, and no query.
    if !gpus.is_empty() {
        let known: HashSet<String> =
            sqlx::query_scalar::<_, String>("SELECT uuid FROM gpus WHERE node_id = $1")
                .bind(node_id)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
        let new: Vec<GpuInfo> = gpus
            .iter()
            .filter(|g| !known.contains(&g.uuid))
            .cloned()
            .collect();
        if !new.is_empty() {
            insert_gpus(&mut tx, node_id, &new).await?;
        }
    }
    let due = store.samples.due(node_id, report.telemetry.as_ref(), at);
    let row = sqlx::query(NODE_SEEN)
        .bind(at)
        .bind(i64::from(changed))
        .bind(node_id)
        .bind(due.as_ref().map(|d| d.json.as_str()))
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    if let Some(due) = &due {
        store.samples.written(node_id, due, at);
    }
    synced(row, node_id)
}

/// `heartbeat`'s statement: `NODE_SEEN` as a CTE, then the answer's read.
static HEARTBEAT: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("WITH seen AS ({NODE_SEEN}) {}", desired_select!("$3")));

/// A sync's write of the node's row (`$1` the time, `$2` 1 when the desired state changed,
/// `$3` the node, `$4` its telemetry when it is to be written, `samples.rs`), reading back what
/// the answer needs.
const NODE_SEEN: &str =
    "UPDATE nodes SET last_seen_at = $1, desired_version = desired_version + $2,
        telemetry = COALESCE($4, telemetry),
        status = CASE WHEN status = 'lost' THEN 'ready' ELSE status END, lost_at = NULL
     WHERE id = $3
     RETURNING desired_version, health";

fn synced(row: Option<sqlx::any::AnyRow>, node_id: &str) -> Result<Synced> {
    let row = row.ok_or_else(|| StoreError::not_found("node", node_id))?;
    Ok(Synced {
        desired_version: row.try_get("desired_version")?,
        health: row.try_get("health")?,
        desired_state: None,
    })
}

/// Applies one instance report. Reports of another node or an older epoch are ignored, and a
/// report that would not change anything is a no-op, so duplicates are harmless.
async fn apply_report(
    conn: &mut AnyConnection,
    node_id: &str,
    report: &InstanceReport,
    now: i64,
) -> Result<bool> {
    let row = sqlx::query(
        "SELECT status, node_id, epoch, restart_policy FROM reservations WHERE id = $1",
    )
    .bind(&report.reservation_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(false) };
    let owner: Option<String> = row.try_get("node_id")?;
    let epoch: i64 = row.try_get("epoch")?;
    if owner.as_deref() != Some(node_id) || epoch != report.epoch {
        tracing::debug!(reservation_id = %report.reservation_id, "ignoring report of a stale epoch");
        return Ok(false);
    }
    let status: String = row.try_get("status")?;
    let status: ReservationStatus = status
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
    if let Some(disk) = report.disk {
        sqlx::query("UPDATE reservations SET disk_used_bytes = $1, disk_bytes = $2 WHERE id = $3")
            .bind(i64::try_from(disk.used_bytes).unwrap_or(i64::MAX))
            .bind(i64::try_from(disk.size_bytes).unwrap_or(i64::MAX))
            .bind(&report.reservation_id)
            .execute(&mut *conn)
            .await?;
    }
    if let Some(pull) = &report.pull {
        // Only a change is written (a pulled instance's running reports repeat the figures).
        sqlx::query(
            "UPDATE reservations SET pull = $1 WHERE id = $2 AND (pull IS NULL OR pull <> $1)",
        )
        .bind(serde_json::to_string(pull).unwrap_or_default())
        .bind(&report.reservation_id)
        .execute(&mut *conn)
        .await?;
    }
    use InstanceState as S;
    use ReservationStatus as R;
    match (status, report.state) {
        (R::Pending, S::Starting) => {
            set_status(conn, &report.reservation_id, status, R::Starting).await
        }
        (R::Pending | R::Starting, S::Running) => {
            let published =
                serde_json::to_string(&report.ports).unwrap_or_else(|_| "[]".to_owned());
            // A reservation rescheduled off a lost node continues: its effective start is
            // moved back by the seconds it ran (and was charged for) before, so its hours and
            // its charge go on where they stopped.
            let n = sqlx::query(
                "UPDATE reservations SET status = 'running', started_at = $1 - run_before_s * 1000000,
                    published = $4
                 WHERE id = $2 AND status = $3",
            )
            .bind(now)
            .bind(&report.reservation_id)
            .bind(status.as_str())
            .bind(published)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if n == 1 {
                // Settled up to its start: the first settlement charges from here.
                sqlx::query(
                    "UPDATE meters SET started_at = (SELECT started_at FROM reservations WHERE id = $2),
                        settled_until = $1 WHERE reservation_id = $2",
                )
                    .bind(now)
                    .bind(&report.reservation_id)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(n == 1)
        }
        (s, S::Stopped | S::Exited | S::Failed) if !s.is_terminal() => {
            super::restarts::run_ended(
                conn,
                &report.reservation_id,
                status,
                super::restarts::policy_of(&row)?,
                Gone::Reported(report),
                now,
            )
            .await
        }
        _ => Ok(false),
    }
}

async fn set_status(
    conn: &mut AnyConnection,
    id: &str,
    from: ReservationStatus,
    to: ReservationStatus,
) -> Result<bool> {
    let n = sqlx::query("UPDATE reservations SET status = $1 WHERE id = $2 AND status = $3")
        .bind(to.as_str())
        .bind(id)
        .bind(from.as_str())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(n == 1)
}

/// Idle reclaim's clock: the running reservations holding a GPU that was busy in this sample
/// (any utilisation; a shared GPU's counts for each of its reservations) were active now.
async fn mark_active(
    conn: &mut AnyConnection,
    node_id: &str,
    samples: &[gpurent_types::agent::GpuSample],
    at: i64,
) -> Result<()> {
    let busy = busy(samples);
    if busy.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "UPDATE reservations SET last_active_at = $1
         WHERE status = 'running' AND node_id = $2
           AND id IN (SELECT reservation_id FROM allocations WHERE gpu_uuid IN ({}))",
        super::batch::placeholders(3, busy.len())
    );
    let mut q = sqlx::query(&sql).bind(at).bind(node_id);
    for uuid in busy {
        q = q.bind(uuid);
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// The GPUs busy in a sample (any utilisation), at most 64.
fn busy(samples: &[gpurent_types::agent::GpuSample]) -> Vec<&str> {
    samples
        .iter()
        .filter(|s| s.utilization_pct > 0 && !s.lost)
        .map(|s| s.uuid.as_str())
        .take(64)
        .collect()
}

pub(super) async fn desired_version(store: &SqlStore, node_id: &str) -> Result<i64> {
    sqlx::query_scalar("SELECT desired_version FROM nodes WHERE id = $1")
        .bind(node_id)
        .fetch_optional(&store.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("node", node_id))
}

pub(super) async fn desired_versions(store: &SqlStore) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as("SELECT id, desired_version FROM nodes")
        .fetch_all(&store.pool)
        .await?)
}

pub(super) async fn desired_state(
    store: &SqlStore,
    node_id: &str,
) -> Result<(i64, Vec<Assignment>)> {
    // No transaction to begin: one statement is one snapshot.
    let rows = sqlx::query(desired_select!("$1"))
        .bind(node_id)
        .fetch_all(&store.pool)
        .await?;
    let (version, _, assignments) = desired_of(&rows, node_id)?;
    Ok((version, assignments))
}

/// The version, health and assignments of `desired_select!`'s rows.
fn desired_of(
    rows: &[sqlx::any::AnyRow],
    node_id: &str,
) -> Result<(i64, Option<String>, Vec<Assignment>)> {
    let first = rows
        .first()
        .ok_or_else(|| StoreError::not_found("node", node_id))?;
    let version: i64 = first.try_get("desired_version")?;
    let health: Option<String> = first.try_get("health")?;
    let mut live = Vec::with_capacity(rows.len());
    for r in rows {
        if r.try_get::<Option<String>, _>("id")?.is_some() {
            live.push(r);
        }
    }
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    let assignments = live
        .iter()
        .map(|r| {
            let status: String = r.try_get("status")?;
            let gpus: String = r.try_get("gpus")?;
            let command: String = r.try_get("command")?;
            let env: String = r.try_get("env")?;
            let epoch: i64 = r.try_get("epoch")?;
            Ok(Assignment {
                reservation_id: r.try_get("id")?,
                epoch,
                // Each run after the first (restarted, or moved off a lost or drained node)
                // came with the next epoch.
                restart_count: u64::try_from(epoch - 1).unwrap_or(0),
                array_index: r
                    .try_get::<Option<i64>, _>("array_index")?
                    .and_then(|i| u64::try_from(i).ok()),
                gpus: serde_json::from_str(&gpus).map_err(corrupt)?,
                vram_mb: r
                    .try_get::<Option<i64>, _>("vram_mb")?
                    .map(|v| u64::try_from(v).unwrap_or(0)),
                image: r.try_get("image")?,
                command: serde_json::from_str(&command).map_err(corrupt)?,
                env: serde_json::from_str::<BTreeMap<String, String>>(&env).map_err(corrupt)?,
                run: status != "stopping",
                ports: serde_json::from_str(&r.try_get::<String, _>("ports")?).map_err(corrupt)?,
                log_offset: u64::try_from(r.try_get::<i64, _>("log_read")?).unwrap_or(0),
                stop_grace_s: r
                    .try_get::<Option<i64>, _>("stop_grace_s")?
                    .map(|g| u64::try_from(g).unwrap_or(0)),
                checkpoint: r.try_get::<i64, _>("checkpoint")? != 0,
                mounts: serde_json::from_str::<Vec<crate::VolumeMountRow>>(
                    &r.try_get::<String, _>("volumes")?,
                )
                .map_err(corrupt)?
                .into_iter()
                .map(crate::VolumeMountRow::for_agent)
                .collect(),
                secrets: Default::default(),
                sealed_secrets: r.try_get("secrets")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((version, health, assignments))
}

pub(super) async fn log_rooms(store: &SqlStore, node_id: &str) -> Result<BTreeMap<String, u64>> {
    let mut conn = store.pool.acquire().await?;
    super::logs::rooms(&mut conn, node_id).await
}
