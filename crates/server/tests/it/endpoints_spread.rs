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
