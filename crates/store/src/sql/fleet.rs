//! Fleet views: the nodes with their GPUs and status (`nodes ls`), and the fleet's capacity and
//! load for the elastic policy.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpurent_types::agent::NodeTelemetry;
use gpurent_types::api::{Gpu, Node};
use gpurent_types::NodeStatus;
use sqlx::Row;

use super::{from_ts, gib, ts, SqlStore};
use crate::{FleetView, Result};

pub(super) async fn list_nodes(
    store: &SqlStore,
    live_since: DateTime<Utc>,
    owner: Option<&str>,
) -> Result<Vec<Node>> {
    let nodes = sqlx::query(
        "SELECT id, name, executor, gpu_backend, last_seen_at, telemetry, owner_id, status,
                verification, verified, health, healthy, isolated, shared_network, cpus, memory_mb,
                volume_enforcement, volume_reason, volume_free_bytes, shared_volumes FROM nodes
         WHERE $1 = '' OR owner_id = $1 ORDER BY name",
    )
    .bind(owner.unwrap_or(""))
    .fetch_all(&store.pool)
    .await?;
    let gpus = sqlx::query(
        "SELECT node_id, uuid, type_name, vram_mb, free_mb, switch_group, missing_since
         FROM gpus ORDER BY node_id, idx",
    )
    .fetch_all(&store.pool)
    .await?;
    let mut by_node: BTreeMap<String, Vec<Gpu>> = BTreeMap::new();
    for g in gpus {
        let vram: i64 = g.try_get("vram_mb")?;
        let free: i64 = g.try_get("free_mb")?;
        let missing = g.try_get::<Option<i64>, _>("missing_since")?.is_some();
        let status = if missing {
            "missing"
        } else if free == vram {
            "free"
        } else if free == 0 {
            "allocated"
        } else {
            "shared"
        };
        by_node.entry(g.try_get("node_id")?).or_default().push(Gpu {
            uuid: g.try_get("uuid")?,
            model: g.try_get("type_name")?,
            vram_gb: gib(vram),
            status: status.to_owned(),
            switch_group: super::switch_of(&g)?,
            telemetry: None,
        });
    }
    let live = ts(live_since);
    nodes
        .iter()
        .map(|n| {
            let id: String = n.try_get("id")?;
            let last_seen: i64 = n.try_get("last_seen_at")?;
            let telemetry: Option<String> = n.try_get("telemetry")?;
            // Telemetry is informative: an unreadable sample is shown as none.
            let telemetry: NodeTelemetry = telemetry
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            let mut gpus = by_node.remove(&id).unwrap_or_default();
            for g in &mut gpus {
                g.telemetry = telemetry.gpus.iter().find(|s| s.uuid == g.uuid).cloned();
            }
            Ok(Node {
                gpus,
                owner_id: n.try_get("owner_id")?,
                driver_version: telemetry.driver_version.clone(),
                cuda_version: telemetry.cuda_version.clone(),
                id,
                name: n.try_get("name")?,
                // A ready node past the TTL that the maintenance loop has not fenced yet
                // is `unreachable`; one that failed host verification `unverified`, one
                // whose GPUs breach a health rule `unhealthy`.
                status: match n.try_get::<String, _>("status")? {
                    s if s == NodeStatus::Ready.as_str() => if last_seen < live {
                        "unreachable"
                    } else if n.try_get::<i64, _>("verified")? == 0 {
                        "unverified"
                    } else if n.try_get::<i64, _>("healthy")? == 0 {
                        "unhealthy"
                    } else {
                        "ready"
                    }
                    .to_owned(),
                    s => s,
                },
                health: n
                    .try_get::<Option<String>, _>("health")?
                    .and_then(|h| serde_json::from_str(&h).ok())
                    .unwrap_or_default(),
                // Informative like telemetry: an unreadable record is shown as none.
                verification: n
                    .try_get::<Option<String>, _>("verification")?
                    .and_then(|v| serde_json::from_str(&v).ok()),
                executor: n.try_get("executor")?,
                isolated: n.try_get::<i64, _>("isolated")? != 0,
                shared_network: n.try_get::<i64, _>("shared_network")? != 0,
                gpu_backend: n.try_get("gpu_backend")?,
                cpus: n
                    .try_get::<Option<i64>, _>("cpus")?
                    .and_then(|c| u32::try_from(c).ok()),
                memory_mb: n
                    .try_get::<Option<i64>, _>("memory_mb")?
                    .and_then(|m| u64::try_from(m).ok()),
                last_seen_at: from_ts(last_seen)?,
                volumes: match n.try_get::<Option<String>, _>("volume_enforcement")? {
                    Some(enforcement) => Some(gpurent_types::agent::VolumeFacts {
                        enforcement,
                        reason: n.try_get("volume_reason")?,
                        free_bytes: n
                            .try_get::<Option<i64>, _>("volume_free_bytes")?
                            .and_then(|b| u64::try_from(b).ok())
                            .unwrap_or(0),
                        shared: n.try_get::<i64, _>("shared_volumes")? != 0,
                    }),
                    None => None,
                },
            })
        })
        .collect()
}

pub(super) async fn fleet(store: &SqlStore, live_since: DateTime<Utc>) -> Result<FleetView> {
    let live = ts(live_since);
    let mut fleet = FleetView::default();
    let nodes = sqlx::query("SELECT telemetry FROM nodes WHERE last_seen_at >= $1")
        .bind(live)
        .fetch_all(&store.pool)
        .await?;
    for n in nodes {
        fleet.live_nodes += 1;
        let telemetry: Option<String> = n.try_get("telemetry")?;
        // Telemetry is informative: an unreadable sample counts as none.
        let Some(t) = telemetry.and_then(|t| serde_json::from_str::<NodeTelemetry>(&t).ok()) else {
            continue;
        };
        fleet
            .gpu_utilization_pct
            .extend(t.gpus.iter().map(|g| g.utilization_pct));
        fleet.cpu_utilization_pct.extend(t.cpu_utilization_pct);
    }
    // Summed here rather than by SUM(), whose type differs between the two databases.
    let gpus = sqlx::query(
        "SELECT g.vram_mb, g.free_mb FROM gpus g JOIN nodes n ON n.id = g.node_id
         WHERE n.last_seen_at >= $1",
    )
    .bind(live)
    .fetch_all(&store.pool)
    .await?;
    for g in gpus {
        fleet.gpus += 1;
        fleet.vram_mb += u64::try_from(g.try_get::<i64, _>("vram_mb")?).unwrap_or(0);
        fleet.free_mb += u64::try_from(g.try_get::<i64, _>("free_mb")?).unwrap_or(0);
    }
    let queued: Vec<Option<i64>> = sqlx::query_scalar(
        "SELECT queued_at FROM reservations WHERE status = 'pending' AND node_id IS NULL",
    )
    .fetch_all(&store.pool)
    .await?;
    fleet.queued = u32::try_from(queued.len()).unwrap_or(u32::MAX);
    fleet.oldest_queued_at = queued
        .into_iter()
        .flatten()
        .min()
        .map(from_ts)
        .transpose()?;
    Ok(fleet)
}
