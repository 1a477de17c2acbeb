//! Cordon, drain and uncordon: a cordoned node takes no new work; a drained node's work runs
//! again elsewhere with the next epoch, its agent stops the old copy, and nobody is billed
//! twice (the ledger attributes each charge to the node it ran on).

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

async fn drain_moves_work_without_billing_twice(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().expect("id").to_owned();
    let first = app.wait_status(&alice.client, &id, "running").await;
    let from = first["node"].as_str().expect("node").to_owned();
    let other = if from == "node-0" { "node-1" } else { "node-0" };

    // Only admins take nodes out.
    let (status, _) = alice
        .client
        .post(&format!("/api/v1/nodes/{from}/drain"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (status, drained) = app
        .admin()
        .post(&format!("/api/v1/nodes/{from}/drain"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{drained}");
    assert_eq!(drained["status"], "draining");
    assert_eq!(drained["moved"], json!([id]));
    app.eventually("the reservation to run on the other node", || async {
        let (_, r) = alice
            .client
            .get(&format!("/api/v1/reservations/{id}"))
            .await;
        r["status"] == "running" && r["node"] == other
    })
    .await;
    let (_, moved) = alice
        .client
        .get(&format!("/api/v1/reservations/{id}"))
        .await;
    assert_eq!(moved["epoch"], json!(2), "{moved}");
    assert_eq!(app.node_status(&from).await, "draining");

    // Cordoned: nothing new lands there (the other node is full).
    let (status, body) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, back) = app
        .admin()
        .post(&format!("/api/v1/nodes/{from}/uncordon"), &json!({}))
        .await;
    assert_eq!((status, &back["status"]), (StatusCode::OK, &json!("ready")));
    let (status, again) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(again["node"], Value::from(from.clone()));

    let (_, stopped) = alice
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert!(stopped["status"].is_string(), "{stopped}");
    app.wait_status(&alice.client, &id, "stopped").await;
    // Balances, holds and each node's earnings from the charges run on it.
    app.assert_consistent().await;
    let (status, _) = app
        .admin()
        .post("/api/v1/nodes/no-such-node/cordon", &json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.shutdown().await;
}
both_stores!(
    drain_moves_work_without_billing_twice_test,
    drain_moves_work_without_billing_twice
);
