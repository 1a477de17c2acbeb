//! Health checks of an endpoint's replicas: a new replica is polled every 100 ms from the moment
//! its instance runs until its health path answers 2xx, then it takes requests; a ready one is
//! checked every few seconds, and taken out after failing three checks in a row.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use gpurent_tunnel::{OpenStream, StreamKind};
use hyper_util::rt::TokioIo;

use super::live::{Live, Slot};
use crate::state::AppState;

/// How often a starting replica is polled.
pub const STARTING_EVERY: Duration = Duration::from_millis(100);
/// How often a ready replica is checked.
pub const READY_EVERY: Duration = Duration::from_secs(5);
/// Failed checks in a row that take a ready replica out.
pub const FAILED_CHECKS_OUT: u32 = 3;
/// How long one check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the replica's app answers 2xx at `path` on `port`, asked through its node's tunnel.
pub async fn check(state: &AppState, slot: &Slot, port: u16, path: &str) -> Result<(), String> {
    tokio::time::timeout(CHECK_TIMEOUT, ask(state, slot, port, path))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "{path} did not answer within {} s",
                CHECK_TIMEOUT.as_secs()
            ))
        })
}

async fn ask(state: &AppState, slot: &Slot, port: u16, path: &str) -> Result<(), String> {
    let open = OpenStream {
        reservation_id: slot.reservation_id.clone(),
        epoch: slot.epoch,
        kind: StreamKind::Tcp { port },
        pty: None,
        env: Vec::new(),
    };
    let stream = state
        .tunnels
        .dial(&slot.node, open)
        .await
        .map_err(|e| format!("cannot reach port {port}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Body>(TokioIo::new(stream.into_io()))
        .await
        .map_err(|e| format!("port {port} does not speak HTTP/1.1: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = axum::http::Request::get(path)
        .header(axum::http::header::HOST, "localhost")
        .header(axum::http::header::USER_AGENT, "gpurent-health-check")
        .body(Body::empty())
        .map_err(|e| format!("health path {path:?}: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("port {port} closed without an answer to {path}: {e}"))?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("{path} answered {}", response.status()))
    }
}

/// Polls a replica until it is ready (or gone), then checks it while it lives; runs as a task
/// of its own, one per replica.
pub async fn watch(state: AppState, live: Arc<Live>, reservation_id: String) {
    let mut ready = false;
    let mut last = Instant::now();
    loop {
        let every = if ready { READY_EVERY } else { STARTING_EVERY };
        tokio::time::sleep(every.saturating_sub(last.elapsed())).await;
        last = Instant::now();
        let (slot, port, path) = {
            let inner = live.lock();
            let Some(slot) = inner
                .slots
                .iter()
                .find(|s| s.reservation_id == reservation_id)
                .cloned()
            else {
                return;
            };
            (
                slot,
                inner.row.spec.port,
                inner.row.scaling.health_path.clone(),
            )
        };
        if slot.node.is_empty() || !slot.running {
            continue;
        }
        match check(&state, &slot, port, &path).await {
            Ok(()) => {
                if live.set_ready(&reservation_id, true) {
                    tracing::info!(reservation = %reservation_id, "endpoint: replica ready");
                }
                ready = true;
            }
            Err(why) => {
                if ready && live.failed_check(&reservation_id, &why) >= FAILED_CHECKS_OUT {
                    tracing::info!(reservation = %reservation_id, %why, "endpoint: replica failed its health checks");
                    live.set_ready(&reservation_id, false);
                    ready = false;
                } else if !ready {
                    live.note_start_failure(&reservation_id, why);
                }
            }
        }
    }
}
