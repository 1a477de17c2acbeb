//! Reading reservation rows as API reservations, and stopping a reservation's meter.

use gpurent_types::api::Reservation;
use gpurent_types::{Money, OnNodeLoss, ReservationStatus, RestartPolicy, Tier};
use sqlx::any::AnyRow;
use sqlx::Row;

use sqlx::AnyConnection;

use super::from_ts;
use crate::{Result, Scope, StoreError};

/// A reservation row's own columns as `reservation_from_row` reads them (without the meter's
/// `charged` and `held` and the node's `node_name`), unqualified.
macro_rules! reservation_fields {
    () => {
        "id, tenant_id, status, gpu_type, gpu_count, vram_mb, tier, price_per_hour, duration_s,
        gpus, image, command, created_at, started_at, ended_at, end_reason, end_message, bid,
        published, queue_reason, placed_at, on_node_loss, epoch, idle_reclaim, checkpoint,
        secret_names, http_ports, volumes, disk_used_bytes, disk_bytes, pull, created_by, borrowed,
        endpoint_replica, restart_policy, max_restarts, restarts, retry_at, array_id, array_index"
    };
}
pub(crate) use reservation_fields;

pub(crate) const RESERVATION_COLUMNS: &str = "r.id, r.tenant_id, r.status, r.gpu_type,
    r.gpu_count, r.vram_mb, r.tier, r.price_per_hour, r.duration_s, r.gpus, r.image, r.command,
    r.created_at, r.started_at, r.ended_at, r.end_reason, r.end_message, COALESCE(m.charged, 0) AS charged,
    COALESCE(m.held, 0) AS held, r.bid, r.published, r.queue_reason, r.placed_at, r.on_node_loss, r.epoch, r.idle_reclaim, r.checkpoint, r.secret_names, r.http_ports, r.volumes, r.disk_used_bytes, r.disk_bytes, r.pull, r.created_by, r.borrowed, r.endpoint_replica, r.restart_policy, r.max_restarts, r.restarts, r.retry_at, r.array_id, r.array_index, n.name AS node_name, t.name AS team_name,
    e.name AS endpoint_name
    FROM reservations r LEFT JOIN nodes n ON n.id = r.node_id
    LEFT JOIN endpoints e ON e.id = r.endpoint_id
    LEFT JOIN meters m ON m.reservation_id = r.id
    LEFT JOIN users t ON t.id = r.tenant_id AND t.kind = 'team'";

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

pub(crate) fn reservation_from_row(row: &AnyRow) -> Result<Reservation> {
    let status: String = row.try_get("status")?;
    let tier: String = row.try_get("tier")?;
    let gpus: String = row.try_get("gpus")?;
    let command: String = row.try_get("command")?;
    let published: String = row.try_get("published")?;
    let vram_mb: Option<i64> = row.try_get("vram_mb")?;
    let duration_s: i64 = row.try_get("duration_s")?;
    let created_at: i64 = row.try_get("created_at")?;
    let opt_ts =
        |col: &str| -> Result<_> { row.try_get::<Option<i64>, _>(col)?.map(from_ts).transpose() };
    #[allow(clippy::cast_precision_loss)] // durations are far below 2^52 seconds
    let hours = duration_s as f64 / 3600.0;
    Ok(Reservation {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        team: row.try_get("team_name")?,
        created_by: row.try_get("created_by")?,
        borrowed: row.try_get::<i64, _>("borrowed")? != 0,
        endpoint: row.try_get("endpoint_name")?,
        endpoint_replica: row
            .try_get::<Option<i64>, _>("endpoint_replica")?
            .and_then(|n| u64::try_from(n).ok()),
        array: None,
        array_id: row.try_get("array_id")?,
        array_index: row
            .try_get::<Option<i64>, _>("array_index")?
            .and_then(|n| u64::try_from(n).ok()),
        status: status.parse::<ReservationStatus>().map_err(corrupt)?,
        gpu_type: row.try_get("gpu_type")?,
        gpu_count: u32::try_from(row.try_get::<i64, _>("gpu_count")?).map_err(corrupt)?,
        // To the nearest GB, as offers show cards: all of a 24,564 MiB card is 24 (and a
        // sliver of a fraction is not 0).
        vram_gb: vram_mb.map(|mb| super::gib(mb).max(1)),
        tier: tier.parse::<Tier>().map_err(corrupt)?,
        price_per_hour: Money::from_micros(row.try_get("price_per_hour")?),
        hours,
        node: row.try_get("node_name")?,
        gpus: serde_json::from_str(&gpus).map_err(corrupt)?,
        ports: serde_json::from_str(&published).map_err(corrupt)?,
        image: row.try_get("image")?,
        command: serde_json::from_str(&command).map_err(corrupt)?,
        created_at: from_ts(created_at)?,
        started_at: opt_ts("started_at")?,
        ended_at: opt_ts("ended_at")?,
        end_reason: row.try_get("end_reason")?,
        end_message: row.try_get("end_message")?,
        charged: Money::from_micros(row.try_get("charged")?),
        held: Money::from_micros(row.try_get("held")?),
        bid: row
            .try_get::<Option<i64>, _>("bid")?
            .map(Money::from_micros),
        queue_reason: row.try_get("queue_reason")?,
        waited_s: row
            .try_get::<Option<i64>, _>("placed_at")?
            .map(|placed| waited_seconds(placed, created_at)),
        on_node_loss: row
            .try_get::<String, _>("on_node_loss")?
            .parse::<OnNodeLoss>()
            .map_err(corrupt)?,
        epoch: row.try_get("epoch")?,
        restart: row
            .try_get::<String, _>("restart_policy")?
            .parse::<RestartPolicy>()
            .map_err(corrupt)?,
        max_restarts: u32::try_from(row.try_get::<i64, _>("max_restarts")?).unwrap_or(0),
        restarts: serde_json::from_str(&row.try_get::<String, _>("restarts")?).map_err(corrupt)?,
        // Only while it waits for it (a run placed since keeps the column).
        retry_at: opt_ts("retry_at")?.filter(|_| {
            status == ReservationStatus::Pending.as_str()
                && row
                    .try_get::<Option<String>, _>("node_name")
                    .ok()
                    .flatten()
                    .is_none()
        }),
        idle_reclaim: row.try_get::<i64, _>("idle_reclaim")? != 0,
        checkpoint: row.try_get::<i64, _>("checkpoint")? != 0,
        secrets: serde_json::from_str(&row.try_get::<String, _>("secret_names")?)
            .map_err(corrupt)?,
        http_ports: serde_json::from_str(&row.try_get::<String, _>("http_ports")?)
            .map_err(corrupt)?,
        volumes: serde_json::from_str::<Vec<crate::VolumeMountRow>>(
            &row.try_get::<String, _>("volumes")?,
        )
        .map_err(corrupt)?
        .iter()
        .map(crate::VolumeMountRow::shown)
        .collect(),
        http: Vec::new(),
        // Connection details are the control plane's to add (they depend on its endpoint).
        ssh: None,
        disk: match (
            row.try_get::<Option<i64>, _>("disk_used_bytes")?,
            row.try_get::<Option<i64>, _>("disk_bytes")?,
        ) {
            (Some(used), Some(size)) => Some(gpurent_types::agent::DiskUse {
                used_bytes: u64::try_from(used).unwrap_or(0),
                size_bytes: u64::try_from(size).unwrap_or(0),
            }),
            _ => None,
        },
        pull: row
            .try_get::<Option<String>, _>("pull")?
            .map(|p| serde_json::from_str(&p))
            .transpose()
            .map_err(corrupt)?,
    })
}

/// Seconds between two instants in microseconds, to the microsecond.
fn waited_seconds(placed: i64, created: i64) -> f64 {
    #[allow(clippy::cast_precision_loss)] // waits are far below 2^52 microseconds
    let micros = placed.saturating_sub(created).max(0) as f64;
    micros / 1e6
}

/// The tenants a `Scope::Tenant` user sees, as SQL on its id at `$n`: themselves and the teams
/// they are a member of (any role; what a role may do is the server's to say).
pub(crate) fn seen_tenants(n: usize) -> String {
    format!(
        "(SELECT CAST(${n} AS TEXT) UNION ALL
          SELECT tm.team_id FROM team_members tm WHERE tm.user_id = ${n})"
    )
}

pub(crate) fn scope_param(scope: &Scope) -> &str {
    match scope {
        Scope::Tenant(id) => id,
        Scope::All => "",
    }
}

pub(crate) async fn fetch_reservation(
    conn: &mut AnyConnection,
    id: &str,
    scope: &Scope,
) -> Result<Reservation> {
    // Another tenant's reservation is reported as not found, not forbidden.
    let row = sqlx::query(&format!(
        "SELECT {RESERVATION_COLUMNS} WHERE r.id = $1 AND ($2 = '' OR r.tenant_id IN {})",
        seen_tenants(2)
    ))
    .bind(id)
    .bind(scope_param(scope))
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| StoreError::not_found("reservation", id))?;
    reservation_from_row(&row)
}

/// A reservation that stops running stops being settled: `finish` charges the rest when its
/// agent confirms.
pub(crate) async fn stop_meter(conn: &mut AnyConnection, reservation_id: &str) -> Result<()> {
    sqlx::query("UPDATE meters SET settled_until = NULL WHERE reservation_id = $1")
        .bind(reservation_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}
