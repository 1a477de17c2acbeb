//! What agents report of their GPUs (the VRAM watchdog's findings): kept as events, and for a
//! reservation also written as a line into its log, where its tenant sees it (a stop's reason
//! by its ending, as its `end_message`).

use gpurent_types::agent::{AgentEvent, AgentEventKind};
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
        if event.kind == AgentEventKind::VramExceeded {
            // Its ending writes why into the log (`end_message`), once.
            stopping(conn, node_id, id, at).await?;
        } else {
            super::logs::note(conn, id, &event.detail).await?;
        }
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

/// The agent is stopping the reservation over its GPU memory: billing ends now, when it
/// decided (its stop is reported a second or two later, once the instance is gone), as it does
/// when a tenant asks for a stop. A reservation already stopping keeps its own reason and time.
async fn stopping(conn: &mut AnyConnection, node_id: &str, id: &str, at: i64) -> Result<()> {
    let stopped = sqlx::query(
        "UPDATE reservations SET status = 'stopping', end_reason = 'vram_exceeded',
            stop_requested_at = $1
         WHERE id = $2 AND node_id = $3 AND status = 'running'",
    )
    .bind(at)
    .bind(id)
    .bind(node_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if stopped == 1 {
        super::rows::stop_meter(conn, id).await?;
        super::nodes::bump_version(conn, node_id).await?;
    }
    Ok(())
}
