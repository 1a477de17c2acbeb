//! Templates through the API, on both stores: the shipped ones, a tenant's own and an admin's
//! public ones, who sees and removes which, the refusals, and what a reservation made from one
//! takes (its agent's assignment shows the image, command, environment, ports and mounts).

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

const GB: u64 = 1_000_000_000;

fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

fn message(body: &Value) -> String {
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn templates_are_kept_shared_and_applied(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (node, sync) = app.node_by_hand("n1").await;
    let mut first = sync.clone();
    first["host"] = json!({"disk_free_mb": 900_000,
        "volumes": {"enforcement": "loop", "free_bytes": 10 * GB, "shared": false}});
    let (status, body) = node.post("/api/v1/agent/sync", &first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ada = app.tenant("ada", "100").await;
    let bob = app.tenant("bob", "100").await;

    // Shipped: shell, jupyter, pytorch, public, no owner.
    let (status, list) = ada.client.get("/api/v1/templates").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(names(&list), ["jupyter", "pytorch", "shell"]);
    let (_, jupyter) = ada.client.get("/api/v1/templates/jupyter").await;
    assert_eq!(jupyter["public"], true);
    assert_eq!(jupyter["owner"], Value::Null);
    assert_eq!(jupyter["http_ports"], json!([8888]));
    let (_, shell) = ada.client.get("/api/v1/templates/shell").await;
    assert_eq!(shell["image"], Value::Null, "{shell}");
    assert_eq!(shell["command"], json!([]));

    // A tenant's own: theirs only.
    let lab = json!({"name": "lab", "image": "gpurent-test/busybox",
        "command": ["sh", "-c", "echo $GREETING"], "env": {"GREETING": "hi", "MODE": "t"},
        "http_ports": [8080], "volume_mount": "/data", "description": "a lab"});
    let (status, made) = ada.client.post("/api/v1/templates", &lab).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["public"], false);
    assert_eq!(made["owner"], "ada");
    let (_, list) = ada.client.get("/api/v1/templates").await;
    assert_eq!(names(&list), ["jupyter", "lab", "pytorch", "shell"]);
    let (_, list) = bob.client.get("/api/v1/templates").await;
    assert_eq!(names(&list), ["jupyter", "pytorch", "shell"], "not bob's");
    let (status, _) = bob.client.get("/api/v1/templates/lab").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = ada.client.post("/api/v1/templates", &lab).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        message(&body).contains("you have a template named"),
        "{body}"
    );
    // Bob may have his own "lab"; and a private one may shadow a public name for its owner.
    let (status, _) = bob.client.post("/api/v1/templates", &lab).await;
    assert_eq!(status, StatusCode::CREATED);

    // Bad templates, refused naming the field; nothing made.
    for (body, why) in [
        (json!({"name": "../x", "image": "i"}), "name:"),
        (json!({"name": "x", "image": "has space"}), "image"),
        (
            json!({"name": "x", "image": "i", "env": {"GPURENT_EPOCH": "1"}}),
            "GPURENT_EPOCH",
        ),
        (
            json!({"name": "x", "image": "i", "env": {"1X": "1"}}),
            "variable name",
        ),
        (
            json!({"name": "x", "image": "i", "volume_mount": "/etc"}),
            "volume_mount",
        ),
        (
            json!({"name": "x", "image": "i", "http_ports": [0]}),
            "http_ports",
        ),
        (
            json!({"name": "x", "image": "i", "command": [""]}),
            "command[0]",
        ),
        (
            json!({"name": "x", "image": "i", "description": "x".repeat(501)}),
            "description",
        ),
    ] {
        let (status, answer) = ada.client.post("/api/v1/templates", &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert!(message(&answer).contains(why), "{why}: {answer}");
    }
    let (status, body) = ada
        .client
        .post(
            "/api/v1/templates",
            &json!({"name": "pub", "image": "i", "public": true}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    // An admin publishes one: everyone sees it.
    let (status, body) = app
        .admin()
        .post(
            "/api/v1/templates",
            &json!({"name": "team-env", "image": "gpurent-test/busybox", "public": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, list) = bob.client.get("/api/v1/templates").await;
    assert!(names(&list).contains(&"team-env".to_owned()), "{list}");

    // A reservation from a template: what it gives, and what the body overrides.
    let (status, data) = ada
        .client
        .post(
            "/api/v1/volumes",
            &json!({"name": "data", "size_bytes": GB}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{data}");
    let (status, r) = ada
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1, "template": "lab",
            "env": {"MODE": "mine"}, "volumes": [{"volume": "data", "path": ""}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["image"], "gpurent-test/busybox");
    assert_eq!(r["command"], json!(["sh", "-c", "echo $GREETING"]));
    assert_eq!(r["http_ports"], json!([8080]));
    assert_eq!(
        r["volumes"][0]["path"], "/data",
        "the template's volume mount"
    );
    let (_, answer) = node.post("/api/v1/agent/sync", &sync).await;
    let assignment = answer["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["reservation_id"] == r["id"])
        .unwrap()
        .clone();
    assert_eq!(assignment["env"]["GREETING"], "hi", "{assignment}");
    assert_eq!(assignment["env"]["MODE"], "mine", "the body's env wins");
    let (status, r2) = ada
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1, "template": "lab",
            "image": "other", "command": ["true"], "http_ports": [9000]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r2}");
    assert_eq!(r2["image"], "other");
    assert_eq!(r2["command"], json!(["true"]));
    assert_eq!(r2["http_ports"], json!([9000]));
    // The shell template: no image, no command (an interactive instance).
    let (status, r3) = ada
        .client
        .reserve(json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1, "template": "shell"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r3}");
    assert_eq!(r3["image"], Value::Null);
    assert_eq!(r3["command"], json!([]));

    // Refusals: an unknown template, someone else's, a bare volume with no volume mount.
    for (token, body, why) in [
        (&ada, json!({"template": "nope"}), "no template \"nope\""),
        (
            &bob,
            json!({"template": "team-env", "volumes": [{"volume": "data", "path": ""}]}),
            "has no path",
        ),
        (
            &ada,
            json!({"volumes": [{"volume": "data", "path": ""}]}),
            "NAME:PATH",
        ),
    ] {
        let mut full = json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1});
        full.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        let (status, answer) = token.client.reserve(full).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert!(message(&answer).contains(why), "{why}: {answer}");
    }

    // Removal: one's own; a public one by an admin only.
    let (status, _, body) = bob
        .client
        .send("DELETE", "/api/v1/templates/team-env", None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _, body) = ada
        .client
        .send("DELETE", "/api/v1/templates/lab", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = ada.client.get("/api/v1/templates/lab").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, list) = bob.client.get("/api/v1/templates").await;
    assert!(
        names(&list).contains(&"lab".to_owned()),
        "bob's own lab stays"
    );
    let (status, _, body) = app
        .admin()
        .send("DELETE", "/api/v1/templates/team-env", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

both_stores!(
    templates_are_kept_shared_and_applied_on,
    templates_are_kept_shared_and_applied
);
