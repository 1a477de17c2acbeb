//! The queue: reservations made with `"queue": true` wait as `pending` without a node when
//! nothing fits, and the scheduling loop places them (by priority, preempting spot work for
//! on-demand work) when capacity frees; a queued reservation can be stopped, times out, and
//! survives a restart of the control plane.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

fn id(r: &Value) -> String {
    r["id"].as_str().expect("id").to_owned()
}

async fn balance(client: &Client) -> (String, String) {
    let (_, b) = client.get("/api/v1/balance").await;
    let s = |k: &str| b[k].as_str().unwrap_or_default().to_owned();
    (s("balance"), s("held"))
}

async fn stop(client: &Client, id: &str) -> Value {
    let (status, body) = client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// Asserts the shape of a freshly queued reservation.
fn assert_queued(r: &Value) {
    assert_eq!(r["status"], "pending", "{r}");
    assert_eq!(r["node"], Value::Null, "{r}");
    assert_eq!(r["gpus"], json!([]), "{r}");
    assert_eq!(r["waited_s"], Value::Null, "{r}");
    let reason = r["queue_reason"].as_str().unwrap_or_default();
    assert!(!reason.is_empty(), "{r}");
}

async fn a_queued_reservation_runs_when_the_gpu_frees(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;
    let bob = app.tenant("bob", "10").await;
    let carol = app.tenant("carol", "10").await;
    let one = json!({"gpu_type": "rtx4090", "hours": 1});
    let (status, r) = alice.client.reserve(one.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let first = id(&r);
    assert_eq!(r["queue_reason"], Value::Null);
    let running = app.wait_status(&alice.client, &first, "running").await;
    assert_eq!(running["waited_s"].as_f64(), Some(0.0), "{running}");

    // Without `queue` nothing changes: 409, nothing held.
    let (status, r) = bob.client.reserve(one.clone()).await;
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("no_capacity")),
        "{r}"
    );
    assert_eq!(balance(&bob.client).await, ("10.00".into(), "0.00".into()));

    // With it: 201, pending on no node, the first hour held.
    let mut queued = one.clone();
    queued["queue"] = json!(true);
    let (status, r) = bob.client.reserve(queued.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_queued(&r);
    assert_eq!(
        r["queue_reason"],
        "asked for 1 whole GPUs on one node; the most free on any node is 0"
    );
    let waiting = id(&r);
    assert_eq!(balance(&bob.client).await, ("7.50".into(), "2.50".into()));

    // Stopped while queued: it ends at once and the hold comes back in full.
    let (status, r) = carol.client.reserve(queued.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let given_up = id(&r);
    assert_eq!(balance(&carol.client).await, ("7.50".into(), "2.50".into()));
    let stopped = stop(&carol.client, &given_up).await;
    assert_eq!(stopped["status"], "stopped");
    let (_, r) = carol
        .client
        .get(&format!("/api/v1/reservations/{given_up}"))
        .await;
    assert_eq!(
        (
            r["status"].as_str(),
            r["end_reason"].as_str(),
            r["charged"].as_str()
        ),
        (Some("stopped"), Some("stopped_by_user"), Some("0.00")),
        "{r}"
    );
    assert_eq!(r["queue_reason"], Value::Null);
    assert_eq!(
        balance(&carol.client).await,
        ("10.00".into(), "0.00".into())
    );
    app.assert_consistent().await;

    // Maintenance passes leave it queued while the GPU is taken.
    app.advance(Duration::seconds(30));
    app.wait_nodes_ready().await;
    app.maintenance_tick().await;
    let (_, r) = bob
        .client
        .get(&format!("/api/v1/reservations/{waiting}"))
        .await;
    assert_queued(&r);

    // The GPU frees: the queued reservation is placed and runs; it waited.
    stop(&alice.client, &first).await;
    app.wait_status(&alice.client, &first, "stopped").await;
    let placed = app.wait_status(&bob.client, &waiting, "running").await;
    assert_eq!(placed["node"], "node-0", "{placed}");
    assert_eq!(placed["gpus"].as_array().map(Vec::len), Some(1));
    assert_eq!(placed["queue_reason"], Value::Null);
    let waited = placed["waited_s"].as_f64().unwrap_or_default();
    assert!(waited > 0.0, "{placed}");

    // Its hours count from its start: an hour after it started (not after it was queued),
    // it expires, charged exactly the hour.
    app.advance(Duration::minutes(59));
    app.wait_nodes_ready().await;
    app.maintenance_tick().await;
    let (_, r) = bob
        .client
        .get(&format!("/api/v1/reservations/{waiting}"))
        .await;
    assert_eq!(r["status"], "running", "{r}");
    app.advance(Duration::minutes(2));
    app.wait_nodes_ready().await;
    app.maintenance_tick().await;
    let done = app.wait_status(&bob.client, &waiting, "expired").await;
    assert_eq!(done["charged"], "2.50");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    runs_when_freed,
    a_queued_reservation_runs_when_the_gpu_frees
);

async fn on_demand_goes_before_spot_queued_earlier(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;
    let sally = app.tenant("sally", "10").await;
    let otto = app.tenant("otto", "10").await;
    let (_, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    let first = id(&r);
    app.wait_status(&alice.client, &first, "running").await;

    // Spot cannot preempt on-demand work: it queues; on-demand work cannot either.
    let (status, r) = sally
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "hours": 1, "tier": "spot", "bid": "2.00",
            "queue": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_queued(&r);
    let spot = id(&r);
    app.advance(Duration::seconds(10));
    app.wait_nodes_ready().await;
    let (status, r) = otto
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "queue": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_queued(&r);
    let on_demand = id(&r);

    // The GPU frees: the on-demand reservation runs, the spot one keeps waiting.
    stop(&alice.client, &first).await;
    app.wait_status(&otto.client, &on_demand, "running").await;
    let (_, r) = sally
        .client
        .get(&format!("/api/v1/reservations/{spot}"))
        .await;
    assert_queued(&r);

    // Then the spot one.
    stop(&otto.client, &on_demand).await;
    let placed = app.wait_status(&sally.client, &spot, "running").await;
    assert_eq!(placed["price_per_hour"], "2.00");
    stop(&sally.client, &spot).await;
    app.wait_status(&sally.client, &spot, "stopped").await;
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(priority, on_demand_goes_before_spot_queued_earlier);

async fn queued_on_demand_work_preempts_spot(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;
    let sam = app.tenant("sam", "10").await;
    let otto = app.tenant("otto", "100").await;
    let (_, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    let busy = id(&r);
    let (_, r) = sam
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "tier": "spot"}))
        .await;
    let cheap = id(&r);
    app.wait_status(&alice.client, &busy, "running").await;
    app.wait_status(&sam.client, &cheap, "running").await;

    // Two GPUs: preempting the spot instance alone does not make room, so it waits and
    // nobody is preempted yet.
    let (status, r) = otto
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 1, "queue": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_queued(&r);
    let big = id(&r);
    app.maintenance_tick().await;
    let (_, r) = sam
        .client
        .get(&format!("/api/v1/reservations/{cheap}"))
        .await;
    assert_eq!(r["status"], "running");

    // The on-demand GPU frees: the queue preempts the spot instance for the rest.
    stop(&alice.client, &busy).await;
    let done = app.wait_status(&sam.client, &cheap, "preempted").await;
    assert_eq!(done["end_reason"], "preempted");
    let placed = app.wait_status(&otto.client, &big, "running").await;
    assert_eq!(placed["gpus"].as_array().map(Vec::len), Some(2), "{placed}");
    stop(&otto.client, &big).await;
    app.wait_status(&otto.client, &big, "stopped").await;
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(preemption, queued_on_demand_work_preempts_spot);

async fn a_reservation_queued_too_long_fails(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;
    let bob = app.tenant("bob", "10").await;
    let (_, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 5}))
        .await;
    let first = id(&r);
    app.wait_status(&alice.client, &first, "running").await;
    let (status, r) = bob
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "queue": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let waiting = id(&r);
    app.advance(Duration::minutes(59));
    app.maintenance_tick().await;
    let (_, r) = bob
        .client
        .get(&format!("/api/v1/reservations/{waiting}"))
        .await;
    assert_queued(&r);
    app.advance(Duration::minutes(1));
    app.maintenance_tick().await;
    let (_, r) = bob
        .client
        .get(&format!("/api/v1/reservations/{waiting}"))
        .await;
    assert_eq!(
        (
            r["status"].as_str(),
            r["end_reason"].as_str(),
            r["charged"].as_str()
        ),
        (Some("failed"), Some("queue_timeout"), Some("0.00")),
        "{r}"
    );
    assert_eq!(r["queue_reason"], Value::Null);
    assert_eq!(balance(&bob.client).await, ("10.00".into(), "0.00".into()));
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(timeout, a_reservation_queued_too_long_fails);

async fn the_queue_survives_a_restart(backend: Backend) {
    let mut app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;
    let bob = app.tenant("bob", "10").await;
    let (_, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    let first = id(&r);
    app.wait_status(&alice.client, &first, "running").await;
    let (status, r) = bob
        .client
        .reserve(json!({"gpu_type": "rtx4090", "vram_gb": 20, "hours": 1, "queue": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_queued(&r);
    assert_eq!(r["queue_reason"], "no GPU has 20480 MiB of memory free");
    let waiting = id(&r);

    app.restart_server().await;
    let (_, r) = bob
        .client
        .get(&format!("/api/v1/reservations/{waiting}"))
        .await;
    assert_queued(&r);

    stop(&alice.client, &first).await;
    let placed = app.wait_status(&bob.client, &waiting, "running").await;
    assert_eq!(placed["vram_gb"], 20);
    stop(&bob.client, &waiting).await;
    app.wait_status(&bob.client, &waiting, "stopped").await;
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(restart, the_queue_survives_a_restart);

async fn what_can_never_fit_is_not_queued(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let bob = app.tenant("bob", "100").await;
    for body in [
        json!({"gpu_type": "rtx4090", "gpu_count": 3, "hours": 1, "queue": true}),
        json!({"gpu_type": "rtx4090", "vram_gb": 48, "hours": 1, "queue": true}),
    ] {
        let (status, r) = bob.client.reserve(body).await;
        assert_eq!(
            (status, r["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("no_capacity")),
            "{r}"
        );
    }
    let (status, r) = bob
        .client
        .reserve(json!({"gpu_type": "h100", "hours": 1, "queue": true}))
        .await;
    assert!(status.is_client_error(), "{r}");
    // Not paid for: 402, nothing queued.
    let poor = app.tenant("poor", "0").await;
    let (_, r) = bob
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 1}))
        .await;
    app.wait_status(&bob.client, &id(&r), "running").await;
    let (status, r) = poor
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "queue": true}))
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{r}");
    let (_, mine) = poor.client.get("/api/v1/reservations").await;
    assert_eq!(mine, json!([]));
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(never_fits, what_can_never_fit_is_not_queued);
