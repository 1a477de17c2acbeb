//! An agent's held sync (its long poll) at one replica answers a change made at another: on
//! PostgreSQL each replica reads every node's version once a second (`jobs/versions.rs`) and
//! wakes the held syncs of the nodes whose version moved.

use std::sync::Arc;
use std::time::Duration;

use gpurent_server::{RunningServer, ServerConfig};
use gpurent_store::{Backend, SqlStore};
use gpurent_types::SystemClock;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_sync_answers_a_change_made_at_another_replica() {
    let app = TestApp::with(Backend::Postgres).start().await;
    let (agent, sync) = app.node_by_hand("poller").await;
    let (status, first) = agent.post("/api/v1/agent/sync", &sync).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let known = first["version"].as_i64().expect("a version");

    // A second replica on the same database.
    let other = RunningServer::start(
        "127.0.0.1:0".parse().expect("addr"),
        Arc::new(
            SqlStore::connect(app.database_url())
                .await
                .expect("the second replica's store"),
        ),
        Arc::new(SystemClock),
        ServerConfig::default(),
    )
    .await
    .expect("start the second replica");
    let tenant = app.tenant("ann", "100").await;

    // The agent holds a sync at the first replica for up to 10 s...
    let mut poll = sync.clone();
    poll["known_version"] = json!(known);
    poll["wait_ms"] = json!(10_000);
    let held = tokio::spawn(async move { agent.post("/api/v1/agent/sync", &poll).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // ...while its node's work is reserved at the second.
    let (status, r) = tenant
        .client
        .at(&format!("http://{}", other.addr))
        .reserve(json!({"gpu_type": "RTX 4090", "hours": 1, "command": ["sleep", "60"]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");

    // Without the watch the sync would answer at the end of its wait with the version it read.
    let (status, answer) = held.await.expect("the held sync");
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(
        answer["version"].as_i64().expect("a version") > known,
        "the answer is of the new version: {answer}"
    );
    let assigned: Vec<&str> = answer["assignments"]
        .as_array()
        .expect("assignments")
        .iter()
        .filter_map(|a| a["reservation_id"].as_str())
        .collect();
    assert_eq!(assigned, [r["id"].as_str().expect("an id")], "{answer}");
    other.shutdown().await.expect("the second replica stops");
}
