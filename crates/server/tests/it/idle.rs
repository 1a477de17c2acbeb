//! Idle reclaim: a running reservation whose GPUs stay idle is stopped (end reason `idle`),
//! billed to that moment; one that opted out keeps running, one whose GPU is busy too, and
//! one someone works in (input in an SSH session, `touch_reservation`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpurent_agent::gpu::FakeNvml;
use gpurent_store::prelude::*;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn idle_gpus_are_reclaimed(backend: Backend) {
    // Simulated GPUs are always idle; the H200 probe was taken under load (99%).
    let mut app = TestApp::with(backend)
        .with_sim_gpus("3xRTX4090")
        .with_idle_reclaim(Duration::from_millis(1500))
        .start()
        .await;
    let probe = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/nvidia-h200/nvml-busy.json");
    app.add_node_with(
        "h200-box",
        Arc::new(FakeNvml::load(&probe).expect("fixture")),
    )
    .await;
    let alice = app.tenant("alice", "100").await;
    let mut ids = Vec::new();
    for body in [
        json!({"gpu_type": "rtx4090", "hours": 1}),
        json!({"gpu_type": "rtx4090", "hours": 1, "idle_reclaim": false}),
        json!({"gpu_type": "h200", "hours": 1}),
        json!({"gpu_type": "rtx4090", "hours": 1}),
    ] {
        let (status, r) = alice.client.reserve(body).await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        ids.push(r["id"].as_str().expect("id").to_owned());
    }
    for id in &ids {
        app.wait_status(&alice.client, id, "running").await;
    }
    // Someone types in a shell of the last one, as the SSH relay records it.
    let store = app.store.clone();
    let worked = ids[3].clone();
    let typing = tokio::spawn(async move {
        loop {
            store
                .touch_reservation(&worked, chrono::Utc::now())
                .await
                .expect("touch");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let idle = app.wait_status(&alice.client, &ids[0], "stopped").await;
    assert_eq!(idle["end_reason"], "idle", "{idle}");
    assert_eq!(idle["idle_reclaim"], true);
    // Well past the idle time, the other two still run.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for id in &ids[1..] {
        let (_, r) = alice
            .client
            .get(&format!("/api/v1/reservations/{id}"))
            .await;
        assert_eq!(r["status"], "running", "{r}");
    }
    typing.abort();
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(idle_gpus_are_reclaimed_test, idle_gpus_are_reclaimed);
