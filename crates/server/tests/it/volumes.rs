//! Volumes through the API and the agent protocol, on both stores, with nodes joined by hand
//! (their agents' side is `gpurent`'s `volumes.rs`, with real mounts): where a volume goes and
//! whether it fits, its node told and its report taken, work tied to its node, one writer or
//! many readers under concurrent requests, and the refusals.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

const GB: u64 = 1_000_000_000;

fn share(volume: &str, read_only: bool) -> Value {
    json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1,
           "volumes": [{"volume": volume, "path": "/workspace", "read_only": read_only}]})
}

async fn volumes_go_where_they_fit_and_take_one_writer(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (keeper, sync_keeper) = app.node_by_hand("keeper").await;
    let (plain, sync_plain) = app.node_by_hand("plain").await;
    let mut first = sync_keeper.clone();
    first["host"] = json!({"disk_free_mb": 900_000,
        "volumes": {"enforcement": "loop", "free_bytes": 10 * GB, "shared": false}});
    let (status, body) = keeper.post("/api/v1/agent/sync", &first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut first = sync_plain.clone();
    first["host"] = json!({"disk_free_mb": 900_000});
    let (status, body) = plain.post("/api/v1/agent/sync", &first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ada = app.tenant("ada", "100").await;
    let bob = app.tenant("bob", "100").await;
    let create = |body: Value| {
        let client = ada.client.clone();
        async move { client.post("/api/v1/volumes", &body).await }
    };

    // No node named: the one that keeps volumes; its agent hears of it and reports it made.
    let (status, data) = create(json!({"name": "data", "size_bytes": GB})).await;
    assert_eq!(status, StatusCode::CREATED, "{data}");
    assert_eq!(data["state"], "creating");
    assert_eq!(data["node"], "keeper");
    let id = data["id"].as_str().unwrap().to_owned();
    let (_, answer) = keeper.post("/api/v1/agent/sync", &sync_keeper).await;
    assert_eq!(
        answer["volumes"],
        json!([{"volume_id": id, "kind": "local", "size_bytes": GB, "made": false, "remove": false}])
    );
    let mut report = sync_keeper.clone();
    report["known_version"] = answer["version"].clone();
    report["volumes"] = json!([{"volume_id": id, "size_bytes": GB, "used_bytes": 4096}]);
    report["volume_free_bytes"] = json!(9 * GB);
    let (status, body) = keeper.post("/api/v1/agent/sync", &report).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, got) = ada.client.get("/api/v1/volumes/data").await;
    assert_eq!(got["state"], "ready", "{got}");
    assert_eq!(got["used_bytes"], 4096);
    assert_eq!(got["enforcement"], "loop");
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let kept = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "keeper")
        .unwrap();
    assert_eq!(kept["volumes"]["free_bytes"], 9 * GB, "{kept}");

    // What does not fit or cannot be, refused saying why; nothing made.
    for (body, status, why) in [
        (
            json!({"name": "huge", "size_bytes": 20 * GB}),
            StatusCode::CONFLICT,
            "room for",
        ),
        (
            json!({"name": "p", "size_bytes": GB, "node": "plain"}),
            StatusCode::CONFLICT,
            "keeps no volumes",
        ),
        (
            json!({"name": "s", "size_bytes": GB, "shared": true}),
            StatusCode::CONFLICT,
            "shared volume storage",
        ),
        (
            json!({"name": "tiny", "size_bytes": 1024}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "size_bytes",
        ),
        (
            json!({"name": "a/b", "size_bytes": GB}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name:",
        ),
        (
            json!({"name": "data", "size_bytes": GB}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "you have a volume named",
        ),
    ] {
        let (got, answer) = create(body.clone()).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(why),
            "{body}: {answer}"
        );
    }
    // 9 GB free less what data may still take (1 GB less the 4096 bytes it holds).
    let (status, body) = create(json!({"name": "eight", "size_bytes": 8 * GB + 4097})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (_, listed) = ada.client.get("/api/v1/volumes").await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // Another tenant's volume does not exist for them.
    let (status, _) = bob.client.get("/api/v1/volumes/data").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = bob.client.reserve(share("data", true)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // Six writers at once: one gets it, each other is told who has it; all on its node.
    let tries = (0..6).map(|_| {
        let client = ada.client.clone();
        tokio::spawn(async move { client.reserve(share("data", false)).await })
    });
    let mut placed = Vec::new();
    for t in tries {
        let (status, body) = t.await.unwrap();
        match status {
            StatusCode::CREATED => placed.push(body),
            StatusCode::CONFLICT => assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("mounted read-write by reservation"),
                "{body}"
            ),
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(placed.len(), 1, "one writer");
    assert_eq!(placed[0]["node"], "keeper", "on its volume's node");
    assert_eq!(placed[0]["volumes"][0]["name"], "data");
    let writer = placed[0]["id"].as_str().unwrap().to_owned();
    let (_, answer) = keeper.post("/api/v1/agent/sync", &sync_keeper).await;
    let assignment = answer["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["reservation_id"] == writer.as_str())
        .unwrap();
    assert_eq!(
        assignment["mounts"],
        json!([{"volume_id": id, "kind": "local", "size_bytes": GB, "path": "/workspace", "read_only": false}])
    );
    let (status, _, body) = ada
        .client
        .send("DELETE", "/api/v1/volumes/data", None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stop it first"),
        "{body}"
    );

    // Readers: any number at once, and no writer while they read.
    let (status, sets) = create(json!({"name": "sets", "size_bytes": GB})).await;
    assert_eq!(status, StatusCode::CREATED, "{sets}");
    let tries = (0..5).map(|_| {
        let client = ada.client.clone();
        tokio::spawn(async move { client.reserve(share("sets", true)).await })
    });
    for t in tries {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["node"], "keeper");
    }
    let (status, body) = ada.client.reserve(share("sets", false)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mounted read-only by"),
        "{body}"
    );
    let (_, got) = ada.client.get("/api/v1/volumes/sets").await;
    assert_eq!(got["used_by"].as_array().unwrap().len(), 5, "{got}");

    // Whole GPUs on its node are taken: queued, saying it waits for that node.
    let (status, body) = ada
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "gpu_count": 1, "hours": 1, "queue": true,
                        "volumes": [{"volume": "sets", "path": "/data", "read_only": true}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["status"], "pending", "{body}");
    assert!(
        body["queue_reason"]
            .as_str()
            .unwrap()
            .contains("its volume sets"),
        "{body}"
    );
    app.assert_consistent().await;
}
both_stores!(
    volumes_go_where_they_fit_and_take_one_writer,
    volumes_go_where_they_fit_and_take_one_writer
);
