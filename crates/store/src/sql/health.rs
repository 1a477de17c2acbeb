//! Node health: which health rules a node's GPUs breach, and the events when that changes.

use chrono::{DateTime, Utc};

use super::{ts, SqlStore};
use crate::{Result, StoreError};

pub(super) async fn record_health(
    store: &SqlStore,
    node_id: &str,
    issues: &[gpurent_types::api::HealthIssue],
    now: DateTime<Utc>,
) -> Result<bool> {
    let json = if issues.is_empty() {
        None
    } else {
        Some(serde_json::to_string(issues).map_err(|e| StoreError::Corrupt(e.to_string()))?)
    };
    let mut tx = store.begin().await?;
    let before: Option<Option<String>> =
        sqlx::query_scalar("SELECT health FROM nodes WHERE id = $1")
            .bind(node_id)
            .fetch_optional(&mut *tx)
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
    sqlx::query("UPDATE nodes SET health = $1, healthy = $2 WHERE id = $3")
        .bind(&json)
        .bind(i64::from(issues.is_empty()))
        .bind(node_id)
        .execute(&mut *tx)
        .await?;
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
    Ok(issues.is_empty() && before.is_some())
}
