//! What agents report of their GPUs (the VRAM watchdog's findings): kept as events, and for a
//! reservation also written as a line into its log, where its tenant sees it.

use gpurent_types::agent::AgentEvent;
use sqlx::AnyConnection;

use crate::Result;

/// Records one event of the node's agent. One that names a reservation the node does not run
/// is dropped with a warning: an agent writes into the logs of its own reservations only.
pub(crate) async fn record(
    conn: &mut AnyConnection,
    node_id: &str,
    event: &AgentEvent,
    at: i64,
) -> Result<()> {
    if let Some(id) = &event.reservation_id {
        let on: Option<Option<String>> =
            sqlx::query_scalar("SELECT node_id FROM reservations WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?;
        if on.flatten().as_deref() != Some(node_id) {
            tracing::warn!(reservation_id = %id, %node_id, kind = event.kind.as_str(), "agent event of a reservation not on its node dropped");
            return Ok(());
        }
        super::logs::note(conn, id, &event.detail).await?;
    }
    sqlx::query(
        "INSERT INTO events (at, node_id, kind, detail, reservation_id) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(at)
    .bind(node_id)
    .bind(event.kind.as_str())
    .bind(&event.detail)
    .bind(event.reservation_id.as_deref())
    .execute(&mut *conn)
    .await?;
    Ok(())
}
