//! The events queued for webhooks: budget alerts (from the budget pass), and what the
//! maintenance loop finds each tick of the platform's doing since its last look: reservations
//! ended by the platform or placed from the queue, nodes lost or unhealthy. Each is queued once
//! per webhook (its key), whichever replica sees it first.

use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::state::AppState;

/// The end reasons that are the platform's doing (a user's stop and an expiry are not).
pub(crate) const PLATFORM_ENDINGS: &[&str] = &[
    "preempted",
    "vram_exceeded",
    "idle",
    "lost",
    "failed_to_start",
    "budget",
    "insufficient_credit",
];
/// How far back a look reaches before its last one: commits that landed late.
const OVERLAP: chrono::Duration = chrono::Duration::seconds(10);
/// How far back the first look of a process reaches.
const FIRST_LOOK: chrono::Duration = chrono::Duration::minutes(10);

/// How long a delivery done is kept (its attempts with it).
const KEEP_DONE: chrono::Duration = chrono::Duration::days(7);
/// How often done deliveries are pruned.
const PRUNE_EVERY: chrono::Duration = chrono::Duration::hours(1);

/// When this replica last looked, and last pruned.
#[derive(Debug, Default)]
pub struct Scan {
    last: Mutex<Option<DateTime<Utc>>>,
    pruned: Mutex<Option<DateTime<Utc>>>,
}

/// Queues `kind` for `owner_id`'s webhooks (or only `hook`), as the JSON every delivery
/// carries: `{"event", "owner_id", "at", "data"}`.
pub(crate) async fn queue(
    state: &AppState,
    owner_id: &str,
    hook: Option<&str>,
    kind: &str,
    key: &str,
    data: Value,
    at: DateTime<Utc>,
) -> Result<u64, gpurent_store::StoreError> {
    let payload = json!({"event": kind, "owner_id": owner_id, "at": at, "data": data});
    state
        .store
        .enqueue(owner_id, hook, kind, key, &payload.to_string(), at)
        .await
}

/// Queues the platform's events since the last look, and sends what is due.
pub(crate) async fn tick(
    state: &AppState,
    now: DateTime<Utc>,
) -> Result<(), gpurent_store::StoreError> {
    let since = {
        let last = state.notify_scan.last.lock().map(|l| *l).unwrap_or(None);
        last.map_or(now - FIRST_LOOK, |l| l - OVERLAP)
    };
    for e in state.store.platform_events(since, PLATFORM_ENDINGS).await? {
        let key = format!("{}:{}:{}", e.kind, e.subject, e.at.timestamp_micros());
        let data = match e.kind {
            "reservation_ended" => json!({"reservation_id": e.subject, "end_reason": e.detail}),
            "reservation_placed" => json!({"reservation_id": e.subject}),
            "reservation_restarted" => json!({"reservation_id": e.subject,
                "restart_count": e.detail.as_deref().and_then(|d| d.parse::<u64>().ok()).unwrap_or(0)}),
            "node_lost" => json!({"node_id": e.subject, "name": e.detail}),
            _ => json!({"node_id": e.subject, "detail": e.detail}),
        };
        queue(state, &e.owner_id, None, e.kind, &key, data, e.at).await?;
    }
    if let Ok(mut last) = state.notify_scan.last.lock() {
        *last = Some(now);
    }
    super::deliver::kick(state);
    let due = state
        .notify_scan
        .pruned
        .lock()
        .map(|mut p| {
            let due = p.is_none_or(|t| now >= t + PRUNE_EVERY);
            if due {
                *p = Some(now);
            }
            due
        })
        .unwrap_or(false);
    if due {
        let pruned = state.store.prune_deliveries(now - KEEP_DONE).await?;
        if pruned > 0 {
            tracing::debug!(pruned, "forgot webhook deliveries done a week ago");
        }
    }
    Ok(())
}
