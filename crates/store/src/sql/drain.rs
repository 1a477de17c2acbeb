//! Cordon, drain and uncordon: a drained node's work is billed to now and queued again to run
//! elsewhere.

use chrono::{DateTime, Utc};
use gpurent_types::{NodeStatus, ReservationStatus};
use sqlx::Row;

use super::endings::requeue_lost;
use super::fragments::unstopped_statuses;
use super::restarts::Requeue;
use super::{ts, SqlStore};
use crate::{Drained, NodeAction, Result, StoreError};

pub(super) async fn schedule_node(
    store: &SqlStore,
    node: &str,
    action: NodeAction,
    now: DateTime<Utc>,
) -> Result<Drained> {
    let mut tx = store.begin().await?;
    let row = sqlx::query("SELECT id, status FROM nodes WHERE id = $1 OR name = $1")
        .bind(node)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            what: "node",
            id: node.to_owned(),
        })?;
    let node_id: String = row.try_get("id")?;
    let status: String = row.try_get("status")?;
    if status == NodeStatus::Lost.as_str() && action != NodeAction::Uncordon {
        return Err(StoreError::Conflict(format!(
            "node {node} is lost: its work was moved when it was fenced"
        )));
    }
    let mut moved = Vec::new();
    if action == NodeAction::Drain {
        let rows = sqlx::query(concat!(
            "SELECT id, status FROM reservations WHERE node_id = $1 AND status IN ",
            unstopped_statuses!(),
            " ORDER BY id"
        ))
        .bind(&node_id)
        .fetch_all(&mut *tx)
        .await?;
        let at = ts(now);
        for r in &rows {
            let id: String = r.try_get("id")?;
            let from: ReservationStatus = r
                .try_get::<String, _>("status")?
                .parse()
                .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
            // Billed to now on this node, then queued again with the next epoch: its agent
            // stops this copy (its desired state no longer lists it), another node runs the
            // next one, billed from when it runs.
            if requeue_lost(
                &mut tx,
                &id,
                from,
                at,
                at,
                &Requeue::moved("drained", "its node is being drained; waiting to run again"),
            )
            .await?
            {
                moved.push(id);
            }
        }
    }
    let new_status = match action {
        NodeAction::Uncordon => NodeStatus::Ready,
        NodeAction::Cordon | NodeAction::Drain => NodeStatus::Draining,
    };
    // A lost node turns ready when its agent syncs again, not by an uncordon.
    sqlx::query(
        "UPDATE nodes SET status = $1, desired_version = desired_version + 1
         WHERE id = $2 AND status IN ('ready', 'draining')",
    )
    .bind(new_status.as_str())
    .bind(&node_id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Drained {
        node_id,
        status: if status == NodeStatus::Lost.as_str() {
            NodeStatus::Lost
        } else {
            new_status
        },
        moved,
    })
}
