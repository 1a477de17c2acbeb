//! An endpoint's replicas spread over nodes where they can (best fit alone would pack them on
//! one), so that one node's loss does not take the endpoint down: its requests go on to the
//! other replica while the lost one is replaced.

use std::time::Duration;

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::endpoints_support::setup_with;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_spread_and_outlive_a_node() {
    let builder = TestApp::with(Backend::Sqlite).with_liveness(Duration::from_secs(1), 2);
    let mut s = setup_with(builder).await;
    // node-0 has four GPUs, node-1 two: best fit puts both replicas on node-1.
    s.add_node("node-1", "2xRTX4090").await;
    s.app.wait_nodes_ready().await;
    s.create(
        "spread",
        json!({}),
        json!({"min_replicas": 2, "max_replicas": 2, "public": true}),
    )
    .await;
    s.app
        .eventually("two ready replicas", || async {
            s.get("spread").await["ready_replicas"] == 2
        })
        .await;
    let e = s.get("spread").await;
    let nodes: Vec<&str> = e["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].as_str().unwrap())
        .collect();
    assert_ne!(nodes[0], nodes[1], "{e}");

    // node-1 is lost: every GET is still answered.
    s.app.kill_agent("node-1").await;
    for _ in 0..20 {
        let (status, body) = s.send("GET", "spread", "/work").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let a: Value = serde_json::from_str(&body).unwrap();
        assert!(a["replica"].is_string());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And the endpoint is whole again, on the node that is left.
    s.app
        .eventually("two ready replicas on node-0", || async {
            let e = s.get("spread").await;
            e["ready_replicas"] == 2
                && e["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["node"] == "node-0")
        })
        .await;
}

/// A spot replica is preempted as spot work is; while no GPU is free for its replacement, the
/// endpoint holds its requests, and answers them once one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_spot_replica_is_replaced_and_its_requests_held() {
    let s = crate::endpoints_support::setup(Backend::Sqlite).await;
    let (status, e) = s
        .client()
        .post(
            "/api/v1/endpoints",
            &json!({"name": "cheap", "gpu_type": "rtx4090", "command": ["app"], "port": 8000,
                    "tier": "spot", "scaling": {"min_replicas": 1, "max_replicas": 1, "public": true}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{e}");
    s.app
        .eventually("a ready replica", || async {
            s.get("cheap").await["ready_replicas"] == 1
        })
        .await;
    let first = s.get("cheap").await["replicas"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // On-demand work takes all four GPUs: the spot replica is preempted.
    let other = s.app.tenant("olga", "100").await;
    let (status, r) = other
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 4, "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let taker = r["id"].as_str().unwrap().to_owned();
    s.app.wait_status(&s.client(), &first, "preempted").await;

    // A request now waits in the queue, and is answered by the replacement once the GPUs are
    // free again.
    let held = {
        let (http, url) = (s.http.clone(), format!("{}/e/cheap/held", s.app.base));
        tokio::spawn(async move {
            let r = http.get(url).send().await.unwrap();
            (r.status(), r.text().await.unwrap())
        })
    };
    s.app
        .eventually("the request to wait in the queue", || async {
            s.get("cheap").await["queued"] == 1
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !held.is_finished(),
        "a request was answered with no replica"
    );
    let (status, r) = other
        .client
        .post(&format!("/api/v1/reservations/{taker}/stop"), &json!({}))
        .await;
    assert!(status.is_success(), "{r}");
    let (status, body) = held.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_ne!(answer["replica"], first.as_str(), "{answer}");
}
