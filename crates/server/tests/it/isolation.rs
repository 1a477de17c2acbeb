//! A node whose executor does not isolate instances (the process executor with
//! `--allow-unisolated`), or whose instances share its network, is said to be so where
//! tenants and admins look: the node list and the offers.

use std::time::Duration;

use gpurent_store::Backend;
use reqwest::StatusCode;

use crate::app::TestApp;

async fn unisolated_nodes_are_shown_in_nodes_and_offers(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_process_node("bare", Duration::from_secs(1)).await;
    app.add_node("boxed", "1xRTX4090").await;
    app.wait_nodes_ready().await;
    let (status, nodes) = app.admin().get("/api/v1/nodes").await;
    assert_eq!(status, StatusCode::OK, "{nodes}");
    let isolated = |name: &str| {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| n["isolated"].clone())
    };
    assert_eq!(isolated("bare"), Some(false.into()), "{nodes}");
    assert_eq!(isolated("boxed"), Some(true.into()), "{nodes}");
    // Unisolated, its instances share the node's network too; the sim's have none to share.
    let shared = |name: &str| {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| n["shared_network"].as_bool().unwrap_or(false))
    };
    assert_eq!(shared("bare"), Some(true), "{nodes}");
    assert_eq!(shared("boxed"), Some(false), "{nodes}");
    let t = app.tenant("tess", "10").await;
    let (status, offers) = t.client.get("/api/v1/offers").await;
    assert_eq!(status, StatusCode::OK, "{offers}");
    assert_eq!(offers[0]["available"], 2, "{offers}");
    assert_eq!(offers[0]["unisolated"], 1, "{offers}");
    assert_eq!(offers[0]["shared_network"], 1, "{offers}");
    app.shutdown().await;
}
crate::both_stores!(
    unisolated_nodes,
    unisolated_nodes_are_shown_in_nodes_and_offers
);

/// An agent of an earlier release says nothing of its instances' network: a process
/// executor's shared the node's, a container's did not.
async fn older_agents_network_is_inferred(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    for (name, executor) in [("old-process", "process"), ("old-docker", "docker")] {
        let (status, body) = app
            .admin()
            .post("/api/v1/nodes/join-token", &serde_json::json!({}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let (status, body) = app
            .anonymous()
            .post(
                "/api/v1/agent/register",
                &serde_json::json!({"join_token": body["token"], "name": name,
                    "executor": executor, "gpu_backend": "sim", "gpus": []}),
            )
            .await;
        assert!(status.is_success(), "{body}");
    }
    let (status, nodes) = app.admin().get("/api/v1/nodes").await;
    assert_eq!(status, StatusCode::OK, "{nodes}");
    let shared = |name: &str| {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| n["shared_network"].as_bool().unwrap_or(false))
    };
    assert_eq!(shared("old-process"), Some(true), "{nodes}");
    assert_eq!(shared("old-docker"), Some(false), "{nodes}");
    app.shutdown().await;
}
crate::both_stores!(older_agents_network, older_agents_network_is_inferred);
