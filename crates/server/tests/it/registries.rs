//! Registry credentials through the API, on both stores: kept per tenant, never shown again,
//! replaced for the same host, removed; bad hosts refused; and carried, sealed, only by the
//! owner's reservations of an image on that host (docker.io's for an image with no host),
//! never shown among their secrets' names.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn credentials_are_kept_per_tenant_and_never_shown(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (node, sync) = app.node_by_hand("n1").await;
    let ada = app.tenant("ada", "100").await;
    let bob = app.tenant("bob", "100").await;
    let add = json!({"host": "registry.test:5000", "username": "ada", "password": "hunter2"});
    let (status, kept) = ada.client.post("/api/v1/registries", &add).await;
    assert_eq!(status, StatusCode::CREATED, "{kept}");
    assert_eq!(kept["host"], "registry.test:5000");
    assert!(!kept.to_string().contains("hunter2"), "{kept}");
    let again = json!({"host": "registry.test:5000", "username": "ada2", "password": "x"});
    let (status, _) = ada.client.post("/api/v1/registries", &again).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, list) = ada.client.get("/api/v1/registries").await;
    assert_eq!(list.as_array().unwrap().len(), 1, "replaced: {list}");
    assert_eq!(list[0]["username"], "ada2");
    let (_, list) = bob.client.get("/api/v1/registries").await;
    assert_eq!(list, json!([]), "not bob's");
    for (body, why) in [
        (
            json!({"host": "nodots", "username": "u", "password": "p"}),
            "host:",
        ),
        (
            json!({"host": "a b.test", "username": "u", "password": "p"}),
            "host:",
        ),
        (
            json!({"host": "r.test", "username": "", "password": "p"}),
            "username:",
        ),
        (
            json!({"host": "r.test", "username": "u", "password": ""}),
            "password:",
        ),
    ] {
        let (status, answer) = ada.client.post("/api/v1/registries", &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert!(answer.to_string().contains(why), "{why}: {answer}");
    }

    // A reservation of an image on that host carries it for the pull, sealed until the agent's
    // answer; its secrets' names do not show it. Another host's image, and bob's, do not.
    let (status, r) = ada
        .client
        .reserve(json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1,
            "image": "registry.test:5000/team/train:3"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["secrets"], json!([]), "{r}");
    let (status, plain) = bob
        .client
        .reserve(json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1,
            "image": "registry.test:5000/team/train:3"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{plain}");
    let (_, answer) = node.post("/api/v1/agent/sync", &sync).await;
    let of = |id: &serde_json::Value| {
        answer["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["reservation_id"] == *id)
            .unwrap()
            .clone()
    };
    let auth: serde_json::Value = serde_json::from_str(
        of(&r["id"])["secrets"]["GPURENT_REGISTRY_AUTH"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        auth,
        json!({"host": "registry.test:5000", "username": "ada2", "password": "x"})
    );
    assert!(of(&plain["id"])["secrets"]
        .get("GPURENT_REGISTRY_AUTH")
        .is_none());

    // An image with no host is of the default registry, whose credential is docker.io's
    // (index.docker.io is the same host).
    let hub = json!({"host": "index.docker.io", "username": "ada-hub", "password": "pw"});
    let (status, kept) = ada.client.post("/api/v1/registries", &hub).await;
    assert_eq!(status, StatusCode::CREATED, "{kept}");
    assert_eq!(kept["host"], "docker.io");
    let (status, r) = ada
        .client
        .reserve(json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1,
            "image": "pytorch/pytorch:2.5"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let (_, answer) = node.post("/api/v1/agent/sync", &sync).await;
    let auth = answer["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["reservation_id"] == r["id"])
        .map(|a| a["secrets"]["GPURENT_REGISTRY_AUTH"].clone())
        .unwrap();
    let auth: serde_json::Value = serde_json::from_str(auth.as_str().unwrap()).unwrap();
    assert_eq!(
        auth,
        json!({"host": "docker.io", "username": "ada-hub", "password": "pw"})
    );
    let (status, _, body) = ada
        .client
        .send("DELETE", "/api/v1/registries/docker.io", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, _, body) = ada
        .client
        .send("DELETE", "/api/v1/registries/registry.test:5000", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, _) = ada
        .client
        .send("DELETE", "/api/v1/registries/registry.test:5000", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

both_stores!(
    credentials_are_kept_per_tenant_and_never_shown_on,
    credentials_are_kept_per_tenant_and_never_shown
);
