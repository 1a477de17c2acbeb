//! Nodes: registration with a join token, certificates and their revocation, and the host facts an
//! agent reports when it starts (verification, isolation, capacity); a node's count of free whole
//! GPUs.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use gpurent_types::agent::GpuInfo;
use gpurent_types::GpuType;
use sqlx::AnyConnection;

use super::{new_id, ts, SqlStore};
// Where reservations.rs and queue.rs have always found it.
pub(crate) use super::endings::release_gpus;
use crate::{NewNode, NodeCertificate, Result, StoreError};

pub(super) async fn insert_gpus(
    conn: &mut AnyConnection,
    node_id: &str,
    gpus: &[GpuInfo],
) -> Result<()> {
    for g in gpus {
        let vram = i64::try_from(g.vram_mb).unwrap_or(i64::MAX);
        let gpu_type = GpuType::from_driver_name(&g.model);
        let inserted = sqlx::query(
            "INSERT INTO gpus (uuid, node_id, idx, model, type_name, type_key, vram_mb, free_mb)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7) ON CONFLICT (uuid) DO NOTHING",
        )
        .bind(&g.uuid)
        .bind(node_id)
        .bind(i64::from(g.index))
        .bind(&g.model)
        .bind(gpu_type.display())
        .bind(gpu_type.key())
        .bind(vram)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if inserted == 1 {
            adjust_pool(conn, node_id, gpu_type.key(), 1).await?;
        }
        // As the agent sees it now (a GPU moved to another slot keeps its UUID).
        sqlx::query("UPDATE gpus SET switch_group = $1 WHERE uuid = $2 AND node_id = $3")
            .bind(g.switch_group.map(i64::from))
            .bind(&g.uuid)
            .bind(node_id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Moves a node's count of whole free GPUs of a type by `delta`.
pub(crate) async fn adjust_pool(
    conn: &mut AnyConnection,
    node_id: &str,
    type_key: &str,
    delta: i64,
) -> Result<()> {
    // Upsert only to add: SQLite checks the CHECK of the would-be row before the conflict.
    let sql = if delta > 0 {
        "INSERT INTO gpu_pools (node_id, type_key, whole_free) VALUES ($1, $2, $3)
         ON CONFLICT (node_id, type_key) DO UPDATE SET whole_free = gpu_pools.whole_free + $3"
    } else {
        "UPDATE gpu_pools SET whole_free = whole_free + $3 WHERE node_id = $1 AND type_key = $2"
    };
    sqlx::query(sql)
        .bind(node_id)
        .bind(type_key)
        .bind(delta)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(crate) async fn bump_version(conn: &mut AnyConnection, node_id: &str) -> Result<()> {
    sqlx::query("UPDATE nodes SET desired_version = desired_version + 1 WHERE id = $1")
        .bind(node_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(super) async fn create_join_token(
    store: &SqlStore,
    token_hash: &str,
    created_by: &str,
    expires_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO join_tokens (token_hash, created_by, expires_at, created_at)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(token_hash)
    .bind(created_by)
    .bind(ts(expires_at))
    .bind(ts(now))
    .execute(&store.pool)
    .await?;
    Ok(())
}

pub(super) async fn register_node(
    store: &SqlStore,
    node: NewNode,
    now: DateTime<Utc>,
) -> Result<String> {
    let at = ts(now);
    let mut tx = store.begin().await?;
    // The node belongs to whoever made its join token: its earnings go to them.
    let owner: Option<String> = sqlx::query_scalar(
        "SELECT created_by FROM join_tokens WHERE token_hash = $1 AND expires_at > $2",
    )
    .bind(&node.join_token_hash)
    .bind(at)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(owner) = owner else {
        return Err(StoreError::InvalidJoinToken);
    };
    let id = new_id();
    let inserted = sqlx::query(
        "INSERT INTO nodes (id, name, token_hash, executor, gpu_backend, desired_version,
                            last_seen_at, created_at, owner_id, verification, verified, isolated,
                            shared_network)
         VALUES ($1, $2, $3, $4, $5, 1, $6, $6, $7, $8, $9, $10, $11) ON CONFLICT (name) DO NOTHING",
    )
    .bind(&id)
    .bind(&node.name)
    .bind(&node.node_token_hash)
    .bind(&node.executor)
    .bind(&node.gpu_backend)
    .bind(at)
    .bind(&owner)
    .bind(
        node.verification
            .as_ref()
            .and_then(|v| serde_json::to_string(v).ok()),
    )
    .bind(i64::from(node.verification.as_ref().is_none_or(|v| v.ok)))
    .bind(i64::from(node.isolated))
    .bind(i64::from(node.shared_network))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Err(StoreError::Conflict(format!(
            "a node named {:?} is already registered; restart its agent with its data dir to resume it",
            node.name
        )));
    }
    let uuids: HashSet<&str> = node.gpus.iter().map(|g| g.uuid.as_str()).collect();
    if uuids.len() != node.gpus.len() {
        return Err(StoreError::Conflict(
            "the node reported one GPU UUID twice".to_owned(),
        ));
    }
    let taken: Option<String> = {
        let mut found = None;
        for g in &node.gpus {
            let owner: Option<String> =
                sqlx::query_scalar("SELECT node_id FROM gpus WHERE uuid = $1")
                    .bind(&g.uuid)
                    .fetch_optional(&mut *tx)
                    .await?;
            if owner.is_some() {
                found = Some(g.uuid.clone());
                break;
            }
        }
        found
    };
    if let Some(uuid) = taken {
        return Err(StoreError::Conflict(format!(
            "GPU {uuid} already belongs to another node"
        )));
    }
    insert_gpus(&mut tx, &id, &node.gpus).await?;
    tx.commit().await?;
    tracing::info!(node_id = %id, name = %node.name, gpus = node.gpus.len(), "node registered");
    Ok(id)
}

/// The node of a credential and its certificate; one that is not revoked is remembered for
/// `read_cache::NODE_TTL` (every agent sync asks).
pub(super) async fn authenticate_node(
    store: &SqlStore,
    token_hash: &str,
) -> Result<Option<(String, NodeCertificate)>> {
    let generation = match store.node_credentials.get(token_hash, |_| true) {
        Ok(found) => return Ok(Some(found)),
        Err(generation) => generation,
    };
    let read_at = std::time::Instant::now();
    let row: Option<(String, Option<String>, Option<i64>)> =
        sqlx::query_as("SELECT id, cert_sha256, cert_revoked_at FROM nodes WHERE token_hash = $1")
            .bind(token_hash)
            .fetch_optional(&store.pool)
            .await?;
    let found = row.map(|(id, sha256, revoked_at)| {
        (
            id,
            NodeCertificate {
                sha256,
                revoked: revoked_at.is_some(),
            },
        )
    });
    if let Some(found) = found.as_ref().filter(|(_, cert)| !cert.revoked) {
        store
            .node_credentials
            .put(token_hash, generation, read_at, found.clone());
    }
    Ok(found)
}

pub(super) async fn set_node_certificate(
    store: &SqlStore,
    node_id: &str,
    sha256: &str,
) -> Result<()> {
    let updated = sqlx::query("UPDATE nodes SET cert_sha256 = $1 WHERE id = $2")
        .bind(sha256)
        .bind(node_id)
        .execute(&store.pool)
        .await?
        .rows_affected();
    store.node_credentials.clear();
    found(updated, node_id)
}

pub(super) async fn node_name(store: &SqlStore, node_id: &str) -> Result<String> {
    sqlx::query_scalar("SELECT name FROM nodes WHERE id = $1")
        .bind(node_id)
        .fetch_optional(&store.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            what: "node",
            id: node_id.to_owned(),
        })
}

pub(super) async fn node_certificate(store: &SqlStore, node_id: &str) -> Result<NodeCertificate> {
    let row: Option<(Option<String>, Option<i64>)> =
        sqlx::query_as("SELECT cert_sha256, cert_revoked_at FROM nodes WHERE id = $1")
            .bind(node_id)
            .fetch_optional(&store.pool)
            .await?;
    let (sha256, revoked_at) = row.ok_or_else(|| StoreError::NotFound {
        what: "node",
        id: node_id.to_owned(),
    })?;
    Ok(NodeCertificate {
        sha256,
        revoked: revoked_at.is_some(),
    })
}

pub(super) async fn revoke_node(
    store: &SqlStore,
    node: &str,
    now: DateTime<Utc>,
) -> Result<String> {
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT id FROM nodes WHERE id = $1 OR name = $1 ORDER BY id")
            .bind(node)
            .fetch_all(&store.pool)
            .await?;
    let node_id = match ids.as_slice() {
        [id] => id.clone(),
        [] => {
            return Err(StoreError::NotFound {
                what: "node",
                id: node.to_owned(),
            })
        }
        _ => {
            return Err(StoreError::Conflict(format!(
                "several nodes are named {node}: give its id"
            )))
        }
    };
    let updated = sqlx::query(
        "UPDATE nodes SET cert_revoked_at = COALESCE(cert_revoked_at, $1) WHERE id = $2",
    )
    .bind(ts(now))
    .bind(&node_id)
    .execute(&store.pool)
    .await?
    .rows_affected();
    found(updated, &node_id)?;
    store.node_credentials.clear();
    tracing::warn!(%node_id, "node certificate revoked");
    Ok(node_id)
}

pub(super) async fn set_verification(
    store: &SqlStore,
    node_id: &str,
    verification: &gpurent_types::api::HostVerification,
) -> Result<()> {
    let json =
        serde_json::to_string(verification).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let updated = sqlx::query("UPDATE nodes SET verification = $1, verified = $2 WHERE id = $3")
        .bind(json)
        .bind(i64::from(verification.ok))
        .bind(node_id)
        .execute(&store.pool)
        .await?
        .rows_affected();
    found(updated, node_id)
}

pub(super) async fn set_isolation(store: &SqlStore, node_id: &str, isolated: bool) -> Result<()> {
    let updated = sqlx::query("UPDATE nodes SET isolated = $1 WHERE id = $2")
        .bind(i64::from(isolated))
        .bind(node_id)
        .execute(&store.pool)
        .await?
        .rows_affected();
    found(updated, node_id)
}

pub(super) async fn set_shared_network(
    store: &SqlStore,
    node_id: &str,
    shared: bool,
) -> Result<()> {
    let updated = sqlx::query("UPDATE nodes SET shared_network = $1 WHERE id = $2")
        .bind(i64::from(shared))
        .bind(node_id)
        .execute(&store.pool)
        .await?
        .rows_affected();
    found(updated, node_id)
}

pub(super) async fn set_capacity(
    store: &SqlStore,
    node_id: &str,
    cpus: Option<u32>,
    memory_mb: Option<u64>,
) -> Result<()> {
    let updated = sqlx::query("UPDATE nodes SET cpus = $1, memory_mb = $2 WHERE id = $3")
        .bind(cpus.map(i64::from))
        .bind(memory_mb.and_then(|m| i64::try_from(m).ok()))
        .bind(node_id)
        .execute(&store.pool)
        .await?
        .rows_affected();
    found(updated, node_id)
}

/// `NotFound` when an update by node id touched no row.
pub(super) fn found(updated: u64, node_id: &str) -> Result<()> {
    if updated == 0 {
        return Err(StoreError::NotFound {
            what: "node",
            id: node_id.to_owned(),
        });
    }
    Ok(())
}
