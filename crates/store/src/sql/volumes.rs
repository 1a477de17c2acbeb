//! Volumes in SQL: made, listed, grown and removed at their owner's word. What their nodes
//! report, and what a node is told to keep, is `volume_nodes.rs`; mounting them into a
//! reservation is `volume_mounts.rs`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::agent::{NodeVolume, VolumeFacts, VolumeReport};
use gpurent_types::api::{Volume, VolumeKind, VolumeState, VolumeUser};
use gpurent_types::Money;
use sqlx::{AnyConnection, Row};

use super::fragments::live_statuses;
use super::nodes::bump_version;
use super::{from_ts, new_id, ts, SqlStore};
use crate::{Backend, NewVolume, Result, StoreError, VolumeNode, VolumeStore};

/// A volume's columns and its node's, for [`volume_of`].
const VOLUME_SELECT: &str = "SELECT v.id, v.name, v.owner_id, v.kind, v.size_bytes, v.used_bytes,
        v.state, v.message, v.created_at, v.node_id, n.name AS node_name,
        v.price_per_gb_month, v.charged, v.unpaid_since,
        n.volume_enforcement, n.last_seen_at, n.status AS node_status
     FROM volumes v LEFT JOIN nodes n ON n.id = v.node_id";

fn bytes(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A volume as its row has it; `used_by` is filled by [`with_users`].
fn volume_of(row: &sqlx::any::AnyRow, live_since: i64) -> Result<Volume> {
    let kind: String = row.try_get("kind")?;
    let kind = VolumeKind::parse(&kind)
        .ok_or_else(|| StoreError::Corrupt(format!("volume kind {kind:?}")))?;
    let stored: String = row.try_get("state")?;
    let mut state = match stored.as_str() {
        "creating" => VolumeState::Creating,
        "ready" => VolumeState::Ready,
        "resizing" => VolumeState::Resizing,
        "deleting" | "deleted" => VolumeState::Deleting,
        "failed" => VolumeState::Failed,
        other => return Err(StoreError::Corrupt(format!("volume state {other:?}"))),
    };
    let node_live = row
        .try_get::<Option<i64>, _>("last_seen_at")?
        .is_some_and(|seen| seen >= live_since)
        && row.try_get::<Option<String>, _>("node_status")?.as_deref() != Some("lost");
    if kind == VolumeKind::Local && !node_live && state != VolumeState::Deleting {
        state = VolumeState::Unavailable;
    }
    let size_bytes = bytes(row.try_get("size_bytes")?);
    Ok(Volume {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        owner_id: row.try_get("owner_id")?,
        kind,
        size_bytes,
        size_gb: gpurent_types::api::size_in_gb(size_bytes),
        state,
        status: state,
        node: row.try_get("node_name")?,
        enforcement: match kind {
            VolumeKind::Local => row.try_get("volume_enforcement")?,
            VolumeKind::Shared => None,
        },
        used_bytes: row.try_get::<Option<i64>, _>("used_bytes")?.map(bytes),
        used_by: Vec::new(),
        message: row.try_get("message")?,
        created_at: from_ts(row.try_get("created_at")?)?,
        price_per_gb_month: Money::from_micros(row.try_get("price_per_gb_month")?),
        charged: Money::from_micros(row.try_get("charged")?),
        unpaid_since: row
            .try_get::<Option<i64>, _>("unpaid_since")?
            .map(from_ts)
            .transpose()?,
        deletable_after: None,
    })
}

/// Fills each volume's `used_by`: the live reservations that mount it.
async fn with_users(conn: &mut AnyConnection, mut volumes: Vec<Volume>) -> Result<Vec<Volume>> {
    if volumes.is_empty() {
        return Ok(volumes);
    }
    let marks: Vec<String> = (1..=volumes.len()).map(|i| format!("${i}")).collect();
    let sql = format!(
        concat!(
            "SELECT m.volume_id, m.reservation_id, m.read_only FROM volume_mounts m
             JOIN reservations r ON r.id = m.reservation_id
             WHERE r.status IN ",
            live_statuses!(),
            " AND m.volume_id IN ({}) ORDER BY m.reservation_id"
        ),
        marks.join(", ")
    );
    let mut q = sqlx::query(&sql);
    for v in &volumes {
        q = q.bind(v.id.clone());
    }
    let mut users: BTreeMap<String, Vec<VolumeUser>> = BTreeMap::new();
    for row in q.fetch_all(&mut *conn).await? {
        users
            .entry(row.try_get("volume_id")?)
            .or_default()
            .push(VolumeUser {
                reservation_id: row.try_get("reservation_id")?,
                read_only: row.try_get::<i64, _>("read_only")? != 0,
            });
    }
    for v in &mut volumes {
        v.used_by = users.remove(&v.id).unwrap_or_default();
    }
    Ok(volumes)
}

/// The row of `owner`'s (anyone's for `None`) volume named `name_or_id`, or with that id.
/// An admin's name shared by two owners' volumes is refused: the id says which.
pub(super) async fn find(
    conn: &mut AnyConnection,
    owner: Option<&str>,
    name_or_id: &str,
    live_since: i64,
) -> Result<Volume> {
    let rows = sqlx::query(&format!(
        "{VOLUME_SELECT} WHERE (v.id = $1 OR v.name = $1) AND ($2 = '' OR v.owner_id = $2)
           AND v.state <> 'deleted'
         ORDER BY CASE WHEN v.id = $1 THEN 0 ELSE 1 END LIMIT 2"
    ))
    .bind(name_or_id)
    .bind(owner.unwrap_or(""))
    .fetch_all(&mut *conn)
    .await?;
    let mut found: Vec<Volume> = rows
        .iter()
        .map(|r| volume_of(r, live_since))
        .collect::<Result<_>>()?;
    match found.len() {
        0 => Err(StoreError::not_found("volume", name_or_id)),
        2 if found[0].id != name_or_id => Err(StoreError::Conflict(format!(
            "two users have a volume named {name_or_id:?}; name it by its id"
        ))),
        _ => Ok(with_users(conn, vec![found.swap_remove(0)])
            .await?
            .swap_remove(0)),
    }
}

/// Locks the node's row for the rest of the transaction (PostgreSQL; SQLite has one writer)
/// and reads its room for volumes: its free bytes less what its volumes may still grow into.
async fn lock_room(conn: &mut AnyConnection, backend: Backend, node_id: &str) -> Result<i64> {
    let lock = match backend {
        Backend::Postgres => " FOR UPDATE",
        Backend::Sqlite => "",
    };
    let free: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT volume_free_bytes FROM nodes WHERE id = $1{lock}"
    ))
    .bind(node_id)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| StoreError::not_found("node", node_id))?;
    let promised: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(size_bytes - COALESCE(used_bytes, 0)), 0) AS BIGINT)
         FROM volumes WHERE node_id = $1 AND state NOT IN ('deleted', 'failed')",
    )
    .bind(node_id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(free.unwrap_or(0).saturating_sub(promised))
}

fn no_room(node: &str, wanted: u64, room: i64) -> StoreError {
    StoreError::NoCapacity(format!(
        "node {node} has room for {} more of volumes; this needs {}",
        gpurent_types::api::format_size(u64::try_from(room).unwrap_or(0)),
        gpurent_types::api::format_size(wanted)
    ))
}

#[async_trait]
impl VolumeStore for SqlStore {
    async fn create_volume(&self, new: NewVolume, now: DateTime<Utc>) -> Result<Volume> {
        let mut tx = self.begin().await?;
        if let Some(node_id) = &new.node_id {
            let room = lock_room(&mut tx, self.backend, node_id).await?;
            if room < signed(new.size_bytes) {
                return Err(no_room(node_id, new.size_bytes, room));
            }
        }
        let id = new_id();
        let state = match new.kind {
            VolumeKind::Local => "creating",
            VolumeKind::Shared => "ready",
        };
        sqlx::query(
            "INSERT INTO volumes (id, owner_id, name, kind, node_id, size_bytes, state, created_at,
                price_per_gb_month, host_share_bps, billed_from, billed_until)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $8, $8)",
        )
        .bind(&id)
        .bind(&new.owner_id)
        .bind(&new.name)
        .bind(new.kind.as_str())
        .bind(&new.node_id)
        .bind(signed(new.size_bytes))
        .bind(state)
        .bind(ts(now))
        .bind(new.price_per_gb_month.micros())
        .bind(i64::from(new.host_share_bps))
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)
        .map_err(|e| {
            if e.is_unique_violation() {
                StoreError::Duplicate(format!("name: you have a volume named {:?}", new.name))
            } else {
                e
            }
        })?;
        if let Some(node_id) = &new.node_id {
            bump_version(&mut tx, node_id).await?;
        }
        let volume = find(&mut tx, None, &id, i64::MIN).await?;
        tx.commit().await?;
        tracing::info!(volume_id = %id, owner_id = %new.owner_id, kind = new.kind.as_str(), size_bytes = new.size_bytes, "volume created");
        Ok(volume)
    }

    async fn list_volumes(
        &self,
        owner: Option<&str>,
        limit: u32,
        after: Option<&str>,
        live_since: DateTime<Utc>,
    ) -> Result<Vec<Volume>> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(&format!(
            "{VOLUME_SELECT} WHERE ($1 = '' OR v.owner_id = $1) AND v.state <> 'deleted'
               AND ($2 = '' OR (v.created_at, v.id) < (SELECT c.created_at, c.id FROM volumes c
                                                      WHERE c.id = $2))
             ORDER BY v.created_at DESC, v.id DESC LIMIT $3"
        ))
        .bind(owner.unwrap_or(""))
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
        let live_since = ts(live_since);
        let volumes = rows
            .iter()
            .map(|r| volume_of(r, live_since))
            .collect::<Result<Vec<_>>>()?;
        with_users(&mut conn, volumes).await
    }

    async fn volume(
        &self,
        owner: Option<&str>,
        name_or_id: &str,
        live_since: DateTime<Utc>,
    ) -> Result<Volume> {
        let mut conn = self.pool.acquire().await?;
        find(&mut conn, owner, name_or_id, ts(live_since)).await
    }

    async fn resize_volume(
        &self,
        owner: Option<&str>,
        name_or_id: &str,
        size_bytes: u64,
        price_per_gb_month: Money,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Volume> {
        let live_since = ts(live_since);
        let mut tx = self.begin().await?;
        let volume = find(&mut tx, owner, name_or_id, live_since).await?;
        let node_id: Option<String> =
            sqlx::query_scalar("SELECT node_id FROM volumes WHERE id = $1")
                .bind(&volume.id)
                .fetch_one(&mut *tx)
                .await?;
        if let Some(node_id) = &node_id {
            let room = lock_room(&mut tx, self.backend, node_id).await?;
            let more = size_bytes.saturating_sub(volume.size_bytes);
            if room < signed(more) {
                return Err(no_room(node_id, more, room));
            }
        }
        // Charged at the old size up to now; a new stretch at the new size from now.
        let at = ts(now);
        super::volume_billing::settle(&mut tx, self.backend, &volume.id, at).await?;
        let grown = sqlx::query(
            "UPDATE volumes SET size_bytes = $1,
                state = CASE WHEN kind = 'local' THEN 'resizing' ELSE state END, message = NULL,
                price_per_gb_month = $3, billed_from = $4, billed_until = $4, stretch_charged = 0
             WHERE id = $2 AND size_bytes < $1 AND state IN ('creating', 'ready', 'resizing')",
        )
        .bind(signed(size_bytes))
        .bind(&volume.id)
        .bind(price_per_gb_month.micros())
        .bind(at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if grown == 0 {
            return Err(StoreError::Conflict(match volume.state {
                VolumeState::Deleting | VolumeState::Failed => {
                    format!("volume {} is {}", volume.name, volume.state.as_str())
                }
                _ => format!(
                    "volume {} has {} already; a volume only grows (its data would not fit a smaller one)",
                    volume.name,
                    gpurent_types::api::format_size(volume.size_bytes)
                ),
            }));
        }
        if let Some(node_id) = &node_id {
            bump_version(&mut tx, node_id).await?;
        }
        let volume = find(&mut tx, None, &volume.id, live_since).await?;
        tx.commit().await?;
        tracing::info!(volume_id = %volume.id, size_bytes, "volume resized");
        Ok(volume)
    }

    async fn remove_volume(
        &self,
        owner: Option<&str>,
        name_or_id: &str,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Volume> {
        let live_since = ts(live_since);
        let mut tx = self.begin().await?;
        let volume = find(&mut tx, owner, name_or_id, live_since).await?;
        super::volume_mounts::lock_volumes(&mut tx, self.backend, &[volume.id.as_str()]).await?;
        // Read again under the lock: a reservation made meanwhile mounts it.
        let volume = find(&mut tx, None, &volume.id, live_since).await?;
        if let Some(user) = volume.used_by.first() {
            return Err(StoreError::Conflict(format!(
                "volume {} is mounted by reservation {}; stop it first",
                volume.name, user.reservation_id
            )));
        }
        // Charged up to its removal, and no further.
        super::volume_billing::settle(&mut tx, self.backend, &volume.id, ts(now)).await?;
        sqlx::query(
            "UPDATE volumes SET state = 'deleting', deleted_at = COALESCE(deleted_at, $1)
             WHERE id = $2 AND state <> 'deleted'",
        )
        .bind(ts(now))
        .bind(&volume.id)
        .execute(&mut *tx)
        .await?;
        super::volume_nodes::wake_keepers(&mut tx, &volume.id).await?;
        let volume = find(&mut tx, None, &volume.id, live_since).await?;
        tx.commit().await?;
        tracing::info!(volume_id = %volume.id, "volume removed");
        Ok(volume)
    }

    async fn settle_volumes(
        &self,
        now: DateTime<Utc>,
        period: std::time::Duration,
    ) -> Result<usize> {
        self.settle_volume_charges(now, period).await
    }

    async fn volume_nodes(&self, live_since: DateTime<Utc>) -> Result<Vec<VolumeNode>> {
        super::volume_nodes::volume_nodes(self, ts(live_since)).await
    }

    async fn node_volumes(&self, node_id: &str) -> Result<Vec<NodeVolume>> {
        super::volume_nodes::node_volumes(self, node_id).await
    }

    async fn apply_volume_reports(
        &self,
        node_id: &str,
        reports: &[VolumeReport],
        free_bytes: Option<u64>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        super::volume_nodes::apply_reports(self, node_id, reports, free_bytes, now).await
    }

    async fn set_volume_facts(&self, node_id: &str, facts: Option<&VolumeFacts>) -> Result<()> {
        super::volume_nodes::set_facts(self, node_id, facts).await
    }
}
