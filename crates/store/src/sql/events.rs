//! The fleet's event log (nodes turning unhealthy or healthy, agents' events).

use sqlx::Row;

use super::{from_ts, SqlStore};
use crate::Result;

pub(super) async fn last_event_id(store: &SqlStore) -> Result<i64> {
    let last: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM events")
        .fetch_one(&store.pool)
        .await?;
    Ok(last.unwrap_or(0))
}

pub(super) async fn events(
    store: &SqlStore,
    after: i64,
    limit: u32,
) -> Result<Vec<gpurent_types::api::Event>> {
    let rows = sqlx::query(
        "SELECT id, at, node_id, kind, detail, reservation_id FROM events
         WHERE id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(&store.pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(gpurent_types::api::Event {
                id: r.try_get("id")?,
                at: from_ts(r.try_get("at")?)?,
                node_id: r.try_get("node_id")?,
                kind: r.try_get("kind")?,
                detail: r.try_get("detail")?,
                reservation_id: r.try_get("reservation_id")?,
            })
        })
        .collect()
}
