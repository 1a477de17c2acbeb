//! The alert webhook: every event (`gpurent events`: a node's GPUs breaching a health rule or
//! passing again) is POSTed as JSON to `--alert-webhook`, in order, each once it was accepted
//! (a 2xx answer); a failed one is sent again at the next tick, and the ones after it wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::state::AppState;

/// Most events sent in one tick.
const BATCH: u32 = 100;
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct AlertState {
    /// The last event delivered; `None` until the first tick, which starts after the events
    /// that existed when this control plane started (they were sent, or are history).
    cursor: Mutex<Option<i64>>,
    sending: AtomicBool,
    http: reqwest::Client,
}

impl Default for AlertState {
    fn default() -> Self {
        AlertState {
            cursor: Mutex::new(None),
            sending: AtomicBool::new(false),
            http: reqwest::Client::builder()
                .timeout(TIMEOUT)
                .build()
                .unwrap_or_default(),
        }
    }
}

/// Sends the events not yet delivered, in a task of its own (one at a time), so that a slow
/// receiver never holds up the maintenance loop.
pub(crate) async fn deliver(state: &AppState) {
    let Some(url) = state.live().alert_webhook.clone() else {
        return;
    };
    let alerts = state.alerts.clone();
    let known = alerts.cursor.lock().ok().and_then(|c| *c);
    let start = match known {
        Some(start) => start,
        None => match state.store.last_event_id().await {
            Ok(last) => {
                if let Ok(mut cursor) = alerts.cursor.lock() {
                    *cursor = Some(last);
                }
                last
            }
            Err(e) => {
                tracing::warn!(error = %e, "alert webhook: cannot read the events");
                return;
            }
        },
    };
    if alerts.sending.swap(true, Ordering::AcqRel) {
        return;
    }
    let store = state.store.clone();
    tokio::spawn(async move {
        let events = match store.events(start, BATCH).await {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(error = %e, "alert webhook: cannot read the events");
                Vec::new()
            }
        };
        for event in events {
            let sent = alerts
                .http
                .post(&url)
                .json(&event)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status);
            if let Err(e) = sent {
                tracing::warn!(url = %url, event = event.id, error = %e, "alert webhook failed; sent again at the next tick");
                break;
            }
            if let Ok(mut cursor) = alerts.cursor.lock() {
                *cursor = Some(event.id);
            }
        }
        alerts.sending.store(false, Ordering::Release);
    });
}
