//! Volumes as their nodes keep them: what a node offers, what it is told to keep or delete,
//! and what its agent reports back.

use chrono::{DateTime, Utc};
use gpurent_types::agent::{NodeVolume, VolumeFacts, VolumeReport};
use gpurent_types::api::VolumeKind;
use sqlx::{AnyConnection, Row};

use super::nodes::bump_version;
use super::{ts, SqlStore};
use crate::{Result, StoreError, VolumeNode};

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Bumps the version of the nodes that keep a volume (its node; for a shared one every node
/// that mounts the shared storage), so that their agents hear of a change.
pub(super) async fn wake_keepers(conn: &mut AnyConnection, volume_id: &str) -> Result<()> {
    let row = sqlx::query("SELECT kind, node_id FROM volumes WHERE id = $1")
        .bind(volume_id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::not_found("volume", volume_id))?;
    match row.try_get::<Option<String>, _>("node_id")? {
        Some(node) => bump_version(conn, &node).await,
        None => {
            sqlx::query(
                "UPDATE nodes SET desired_version = desired_version + 1
                 WHERE shared_volumes <> 0",
            )
            .execute(&mut *conn)
            .await?;
            Ok(())
        }
    }
}

pub(super) async fn volume_nodes(store: &SqlStore, live_since: i64) -> Result<Vec<VolumeNode>> {
    let rows = sqlx::query(
        "SELECT n.id, n.name, n.last_seen_at, n.status, n.volume_enforcement, n.volume_reason,
            n.shared_volumes,
            CAST(COALESCE(n.volume_free_bytes, 0) - COALESCE((
                SELECT SUM(v.size_bytes - COALESCE(v.used_bytes, 0)) FROM volumes v
                WHERE v.node_id = n.id AND v.state NOT IN ('deleted', 'failed')), 0) AS BIGINT)
              AS room
         FROM nodes n ORDER BY n.name",
    )
    .fetch_all(&store.pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(VolumeNode {
                id: r.try_get("id")?,
                name: r.try_get("name")?,
                live: r.try_get::<i64, _>("last_seen_at")? >= live_since
                    && r.try_get::<String, _>("status")? == "ready",
                enforcement: r.try_get("volume_enforcement")?,
                reason: r.try_get("volume_reason")?,
                room_bytes: r.try_get("room")?,
                shared: r.try_get::<i64, _>("shared_volumes")? != 0,
            })
        })
        .collect()
}

pub(super) async fn node_volumes(store: &SqlStore, node_id: &str) -> Result<Vec<NodeVolume>> {
    let rows = sqlx::query(
        "SELECT id, kind, size_bytes, made_bytes, state FROM volumes
         WHERE node_id = $1 AND state IN ('creating', 'ready', 'resizing', 'deleting')
         UNION ALL
         SELECT id, kind, size_bytes, made_bytes, state FROM volumes
         WHERE kind = 'shared' AND state = 'deleting'
           AND EXISTS (SELECT 1 FROM nodes WHERE id = $1 AND shared_volumes <> 0)
         ORDER BY id",
    )
    .bind(node_id)
    .fetch_all(&store.pool)
    .await?;
    rows.iter()
        .map(|r| {
            let kind: String = r.try_get("kind")?;
            Ok(NodeVolume {
                volume_id: r.try_get("id")?,
                kind: VolumeKind::parse(&kind)
                    .ok_or_else(|| StoreError::Corrupt(format!("volume kind {kind:?}")))?,
                size_bytes: u64::try_from(r.try_get::<i64, _>("size_bytes")?).unwrap_or(0),
                made: r.try_get::<Option<i64>, _>("made_bytes")?.is_some(),
                remove: r.try_get::<String, _>("state")? == "deleting",
            })
        })
        .collect()
}

pub(super) async fn apply_reports(
    store: &SqlStore,
    node_id: &str,
    reports: &[VolumeReport],
    free_bytes: Option<u64>,
    now: DateTime<Utc>,
) -> Result<()> {
    let mut tx = store.begin().await?;
    if let Some(free) = free_bytes {
        sqlx::query("UPDATE nodes SET volume_free_bytes = $1 WHERE id = $2")
            .bind(signed(free))
            .bind(node_id)
            .execute(&mut *tx)
            .await?;
    }
    for report in reports {
        let id = &report.volume_id;
        if report.removed {
            // A shared volume is removed by whichever of its keepers got there first.
            sqlx::query(
                "UPDATE volumes SET state = 'deleted', used_bytes = NULL, message = NULL,
                    deleted_at = COALESCE(deleted_at, $3)
                 WHERE id = $1 AND state = 'deleting' AND (node_id = $2 OR kind = 'shared')",
            )
            .bind(id)
            .bind(node_id)
            .bind(ts(now))
            .execute(&mut *tx)
            .await?;
        } else if let Some(error) = &report.error {
            let message: String = error.chars().take(1000).collect();
            // Never made: failed. A grow that failed: back at the size it has, saying why.
            // A removal that failed stays asked for.
            sqlx::query(
                "UPDATE volumes SET message = $3,
                    state = CASE WHEN state = 'creating' THEN 'failed'
                                 WHEN state = 'resizing' THEN 'ready' ELSE state END,
                    size_bytes = CASE WHEN state = 'resizing' AND made_bytes IS NOT NULL
                                      THEN made_bytes ELSE size_bytes END
                 WHERE id = $1 AND node_id = $2 AND state <> 'deleted'",
            )
            .bind(id)
            .bind(node_id)
            .bind(message)
            .execute(&mut *tx)
            .await?;
        } else if let Some(size) = report.size_bytes {
            sqlx::query(
                "UPDATE volumes SET made_bytes = $3, used_bytes = $4, message = NULL,
                    state = CASE WHEN state IN ('creating', 'resizing') AND $3 >= size_bytes
                                 THEN 'ready' ELSE state END
                 WHERE id = $1 AND node_id = $2 AND state IN ('creating', 'ready', 'resizing')",
            )
            .bind(id)
            .bind(node_id)
            .bind(signed(size))
            .bind(report.used_bytes.map(signed))
            .execute(&mut *tx)
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

pub(super) async fn set_facts(
    store: &SqlStore,
    node_id: &str,
    facts: Option<&VolumeFacts>,
) -> Result<()> {
    sqlx::query(
        "UPDATE nodes SET volume_enforcement = $1, volume_reason = $2, volume_free_bytes = $3,
            shared_volumes = $4
         WHERE id = $5",
    )
    .bind(facts.map(|f| f.enforcement.clone()))
    .bind(facts.and_then(|f| f.reason.clone()))
    .bind(facts.map(|f| signed(f.free_bytes)))
    .bind(i64::from(facts.is_some_and(|f| f.shared)))
    .bind(node_id)
    .execute(&store.pool)
    .await?;
    Ok(())
}
