//! A node-local volume whose node is lost while work waits for it (issue 33): the volume shows
//! as unavailable, the work on it and the work queued for it wait for that node saying so, a
//! new reservation that cannot wait is refused saying why, and when the node comes back the
//! volume is ready again and the waiting work is placed there, nothing left half made.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

use crate::app::TestApp;
use crate::both_stores;

const GB: u64 = 1_000_000_000;

fn reading(queue: bool) -> Value {
    json!({"gpu_type": "rtx4090", "gpu_count": 1, "hours": 1, "queue": queue,
           "volumes": [{"volume": "data", "path": "/data", "read_only": true}]})
}

async fn a_volume_whose_node_is_lost_keeps_its_work_waiting(backend: Backend) {
    let app = TestApp::with(backend)
        .with_manual_clock()
        .with_liveness(Duration::from_secs(2), 3)
        .start()
        .await;
    let (keeper, sync_keeper) = app.node_by_hand("keeper").await;
    let mut first = sync_keeper.clone();
    first["host"] = json!({"disk_free_mb": 900_000,
        "volumes": {"enforcement": "loop", "free_bytes": 10 * GB, "shared": false}});
    let (status, body) = keeper.post("/api/v1/agent/sync", &first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sync = |body: Value| {
        let keeper = keeper.clone();
        async move {
            let (status, answer) = keeper.post("/api/v1/agent/sync", &body).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            answer
        }
    };
    let ada = app.tenant("ada", "100").await;
    let (status, data) = ada
        .client
        .post(
            "/api/v1/volumes",
            &json!({"name": "data", "size_bytes": GB}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{data}");
    let volume = data["id"].as_str().unwrap().to_owned();
    let answer = sync(sync_keeper.clone()).await;
    let mut made = sync_keeper.clone();
    made["known_version"] = answer["version"].clone();
    made["volumes"] = json!([{"volume_id": volume, "size_bytes": GB, "used_bytes": 4096}]);
    made["volume_free_bytes"] = json!(9 * GB);
    sync(made.clone()).await;
    let state = |name: &'static str| {
        let client = ada.client.clone();
        async move { client.get(&format!("/api/v1/volumes/{name}")).await.1 }
    };
    assert_eq!(state("data").await["state"], "ready");

    // One reservation reads it on its node's only GPU; a second waits for that GPU.
    let (status, running) = ada.client.reserve(reading(false)).await;
    assert_eq!(status, StatusCode::CREATED, "{running}");
    assert_eq!(running["node"], "keeper");
    let running = running["id"].as_str().unwrap().to_owned();
    let (status, waiting) = ada.client.reserve(reading(true)).await;
    assert_eq!(status, StatusCode::CREATED, "{waiting}");
    assert_eq!(waiting["status"], "pending", "{waiting}");
    let waiting = waiting["id"].as_str().unwrap().to_owned();

    // The node goes silent past its TTL (2 s x 3 beats) and is lost.
    app.advance(chrono::Duration::seconds(7));
    app.maintenance_tick().await;
    assert_eq!(app.node_status("keeper").await, "lost");
    let got = state("data").await;
    assert_eq!(got["state"], "unavailable", "{got}");
    let reason_of = |id: String| {
        let client = ada.client.clone();
        async move {
            let (_, r) = client.get(&format!("/api/v1/reservations/{id}")).await;
            r
        }
    };
    for id in [&running, &waiting] {
        let r = reason_of(id.clone()).await;
        assert_eq!(r["status"], "pending", "{r}");
        let reason = r["queue_reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("its volume data is on node keeper") && reason.contains("lost"),
            "{r}"
        );
    }
    // Work that cannot wait is refused, saying why; work that may wait queues for the node.
    let (status, body) = ada.client.reserve(reading(false)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("node keeper") && message.contains("lost"),
        "{body}"
    );
    // A volume that cannot be reached cannot be resized or removed either.
    let (status, body) = ada
        .client
        .patch("/api/v1/volumes/data", &json!({"size_bytes": 2 * GB}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // Back: the volume is ready again, and the first in the queue runs there (the reader
    // queued before the node was lost; the rescheduled one was queued again when it was),
    // while the other waits for that node's GPU.
    app.advance(chrono::Duration::seconds(1));
    sync(made.clone()).await;
    app.eventually("the volume's node to be ready", || async {
        app.node_status("keeper").await == "ready"
    })
    .await;
    for _ in 0..50 {
        app.maintenance_tick().await;
        if reason_of(waiting.clone()).await["node"] == "keeper" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state("data").await["state"], "ready");
    let r = reason_of(waiting.clone()).await;
    assert_eq!(
        (&r["node"], &r["epoch"]),
        (&json!("keeper"), &json!(1)),
        "{r}"
    );
    let r = reason_of(running.clone()).await;
    assert_eq!(
        (&r["status"], &r["epoch"]),
        (&json!("pending"), &json!(2)),
        "{r}"
    );
    assert!(
        r["queue_reason"]
            .as_str()
            .is_some_and(|q| q.contains("on node keeper: it runs there or nowhere")),
        "{r}"
    );
    let (_, got) = ada.client.get("/api/v1/volumes/data").await;
    assert_eq!(got["used_by"].as_array().map(Vec::len), Some(2), "{got}");
    app.assert_consistent().await;
}
both_stores!(
    a_volume_whose_node_is_lost_keeps_its_work_waiting,
    a_volume_whose_node_is_lost_keeps_its_work_waiting
);
