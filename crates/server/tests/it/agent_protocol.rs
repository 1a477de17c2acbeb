//! The agent protocol's version: a control plane serves agents of its own protocol and of the
//! one before (agents that send no header: the releases before it), and refuses older and
//! newer ones saying why and what to do, in the answer and in the node's verification.

use gpurent_store::Backend;
use gpurent_types::agent::{AGENT_PROTOCOL, AGENT_PROTOCOL_HEADER, AGENT_VERSION_HEADER};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

fn agent_check(nodes: &Value, name: &str) -> (String, Value) {
    let node = nodes
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == name))
        .unwrap_or_else(|| panic!("no node {name}: {nodes}"));
    let check = node["verification"]["checks"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "agent"))
        .cloned()
        .unwrap_or_else(|| panic!("no agent check: {node}"));
    (
        node["status"].as_str().unwrap_or_default().to_owned(),
        check,
    )
}

async fn agents_one_release_back_are_served_and_others_told_why(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    // An agent of this release: ready, its release in its verification.
    app.add_node("current", "1xRTX4090").await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let (status, check) = agent_check(&nodes, "current");
    assert_eq!(status, "ready");
    assert_eq!(check["ok"], true, "{check}");
    let release = format!("gpurent {}", env!("CARGO_PKG_VERSION"));
    assert_eq!(check["detail"], release.as_str(), "{check}");

    // One of the release before sends no header, nor its release: served.
    let (agent, sync) = app.node_by_hand("previous").await;
    let (status, body) = agent.post("/api/v1/agent/sync", &sync).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut first = sync.clone();
    first["host"] = json!({"disk_free_mb": 900_000});
    let (status, body) = agent.post("/api/v1/agent/sync", &first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let (status, check) = agent_check(&nodes, "previous");
    assert_eq!(status, "ready", "{nodes}");
    assert!(
        check["detail"].as_str().unwrap().contains("protocol 1"),
        "{check}"
    );

    // A newer agent (the node upgraded before the control plane): refused, told to upgrade
    // the control plane first; the node shows why and gets no work.
    let newer = (AGENT_PROTOCOL + 1).to_string();
    let (status, body) = agent
        .post_with_headers(
            "/api/v1/agent/sync",
            &sync,
            &[
                (AGENT_PROTOCOL_HEADER, &newer),
                (AGENT_VERSION_HEADER, "9.9.9"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "agent_protocol", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("gpurent 9.9.9"), "{message}");
    assert!(message.contains("upgrade the control plane"), "{message}");
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let (status, check) = agent_check(&nodes, "previous");
    assert_eq!(status, "unverified", "{nodes}");
    assert_eq!(check["ok"], false);
    assert_eq!(check["detail"], message);

    // Upgraded again to this release: served, and verified anew by its first sync.
    let current = AGENT_PROTOCOL.to_string();
    let (status, body) = agent
        .post_with_headers(
            "/api/v1/agent/sync",
            &first,
            &[(AGENT_PROTOCOL_HEADER, &current)],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    assert_eq!(agent_check(&nodes, "previous").0, "ready", "{nodes}");

    // Too old, or nonsense: refused at registration, saying what to do.
    let (_, join) = app
        .admin()
        .post("/api/v1/nodes/join-token", &json!({}))
        .await;
    let register = json!({
        "join_token": join["token"], "name": "ancient", "executor": "sim",
        "gpu_backend": "sim", "gpus": [],
    });
    for (protocol, says) in [("0", "upgrade the agent"), ("two", "must be a number")] {
        let (status, body) = app
            .anonymous()
            .post_with_headers(
                "/api/v1/agent/register",
                &register,
                &[(AGENT_PROTOCOL_HEADER, protocol)],
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    app.shutdown().await;
}
both_stores!(
    agents_of_one_release_back,
    agents_one_release_back_are_served_and_others_told_why
);
