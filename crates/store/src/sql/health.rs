//! Node health: which health rules a node's GPUs breach, and the events when that changes.

use chrono::{DateTime, Utc};

use super::{ts, SqlStore};
use crate::{Result, StoreError};

/// A node's issues as its `health` column holds them: none is NULL, never an empty string.
pub(crate) fn health_json(issues: &[gpurent_types::api::HealthIssue]) -> Result<Option<String>> {
    if issues.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(issues)
        .map(Some)
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Records a node's health issues (see `NodeStore::record_health`): written, with its event,
/// only when they changed.
pub(super) async fn record_health(
    store: &SqlStore,
    node_id: &str,
    issues: &[gpurent_types::api::HealthIssue],
    now: DateTime<Utc>,
) -> Result<bool> {
    let json = health_json(issues)?;
    // Health seldom changes, and a sync reads what is recorded (`Synced::health_is`): a sync
    // comes here when it changed, and a sample like the last is one read, with no
    // transaction and no write.
    let before: Option<Option<String>> =
        sqlx::query_scalar("SELECT health FROM nodes WHERE id = $1")
            .bind(node_id)
            .fetch_optional(&store.pool)
            .await?;
    let Some(before) = before else {
        return Err(StoreError::NotFound {
            what: "node",
            id: node_id.to_owned(),
        });
    };
    if before == json {
        return Ok(false);
    }
    let mut tx = store.begin().await?;
    // Compared again where it is written, so that of two syncs racing with the same change
    // only one records it (health is never an empty string: none is NULL).
    let changed = sqlx::query(
        "UPDATE nodes SET health = $1, healthy = $2
         WHERE id = $3 AND COALESCE(health, '') <> COALESCE($1, '')",
    )
    .bind(&json)
    .bind(i64::from(issues.is_empty()))
    .bind(node_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(false);
    }
    let (kind, detail) = if issues.is_empty() {
        (
            "node_healthy",
            "every GPU passes the health rules".to_owned(),
        )
    } else {
        let what: Vec<String> = issues
            .iter()
            .map(|i| format!("{}: {} ({})", i.gpu_uuid, i.detail, i.rule))
            .collect();
        ("node_unhealthy", what.join("; "))
    };
    sqlx::query("INSERT INTO events (at, node_id, kind, detail) VALUES ($1, $2, $3, $4)")
        .bind(ts(now))
        .bind(node_id)
        .bind(kind)
        .bind(detail)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    // It changed, so a node with no issues now had some before.
    Ok(issues.is_empty())
}
