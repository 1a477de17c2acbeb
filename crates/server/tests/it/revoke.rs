//! Revoking a node (`gpurent nodes revoke`): only admins may; its agent's syncs are refused
//! from then on, so the node is fenced as lost after its TTL and its work runs elsewhere.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gpurent_types::Clock;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{other_node, TestApp};
use crate::both_stores;

fn at(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .expect("a time")
        .with_timezone(&Utc)
}

/// Moves the manual clock a second at a time, each time until the `live` node has synced.
async fn step(app: &TestApp, seconds: i64, live: &str) {
    for _ in 0..seconds {
        app.advance(chrono::Duration::seconds(1));
        let t = app.clock.as_ref().expect("manual clock").now();
        app.eventually("the live node to sync", || async {
            let (_, nodes) = app.admin().get("/api/v1/nodes").await;
            nodes.as_array().is_some_and(|ns| {
                ns.iter()
                    .any(|n| n["name"] == live && at(&n["last_seen_at"]) >= t)
            })
        })
        .await;
    }
}

async fn a_revoked_node_is_cut_off_and_its_work_runs_elsewhere(backend: gpurent_store::Backend) {
    let app = TestApp::with(backend)
        .with_manual_clock()
        .with_liveness(Duration::from_secs(2), 3)
        .with_sim_gpus("1xRTX4090")
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let t = app.tenant("tia", "100").await;
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().expect("id").to_owned();
    let first = app.wait_status(&t.client, &id, "running").await["node"]
        .as_str()
        .expect("node")
        .to_owned();
    let other = other_node(&first);

    // Only admins revoke; an unknown node is not found.
    let path = format!("/api/v1/nodes/{first}/revoke");
    let (status, _) = t.client.post(&path, &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = app
        .admin()
        .post("/api/v1/nodes/nowhere/revoke", &json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, revoked) = app.admin().post(&path, &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!(revoked["revoked"], true);

    // Its agent is refused from now on: silent past the TTL, the node is fenced and the work
    // runs on the other node with the next epoch.
    step(&app, 7, other).await;
    app.maintenance_tick().await;
    app.eventually("the reservation to run on the other node", || async {
        let (_, r) = t.client.get(&format!("/api/v1/reservations/{id}")).await;
        r["status"] == "running" && r["node"] == other && r["epoch"] == 2
    })
    .await;
    assert_eq!(app.node_status(&first).await, "lost");
    // Revoking again changes nothing; the node stays lost while its agent keeps trying.
    let (status, _) = app.admin().post(&path, &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    step(&app, 3, other).await;
    app.maintenance_tick().await;
    assert_eq!(app.node_status(&first).await, "lost");
    app.assert_consistent().await;
}

both_stores!(
    a_revoked_node_is_cut_off,
    a_revoked_node_is_cut_off_and_its_work_runs_elsewhere
);
