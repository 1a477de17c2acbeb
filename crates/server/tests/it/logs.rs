//! The instance's output reaches `GET /reservations/{id}/logs`, shipped by the real agent
//! from a real process, in order, exactly once, and only to its owner.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn output_reaches_the_owner(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_process_node("proc-node", std::time::Duration::from_secs(10))
        .await;
    let ann = app.tenant("ann", "10").await;
    let script = "echo hello; echo 'héllo wörld' >&2; i=0; while [ $i -lt 200 ]; do echo line $i; i=$((i+1)); done; sleep 300";
    let (status, r) = ann
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "command": ["sh", "-c", script]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let path = format!("/api/v1/reservations/{id}/logs");
    let mut text = String::new();
    let mut next = None;
    for _ in 0..400 {
        let (status, body, header) = ann.client.get_text(&path, "x-log-next-offset").await;
        assert_eq!(status, StatusCode::OK);
        if body.contains("line 199") {
            text = body;
            next = header;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let expected: String = std::iter::once("hello\nhéllo wörld\n".to_owned())
        .chain((0..200).map(|i| format!("line {i}\n")))
        .collect();
    assert_eq!(text, expected);
    // The offset counts bytes (ö and é are two each).
    assert_eq!(next, Some(expected.len().to_string()));
    let (_, rest, again) = ann
        .client
        .get_text(
            &format!("{path}?offset={}", expected.len()),
            "x-log-next-offset",
        )
        .await;
    assert_eq!(
        (rest.as_str(), again),
        ("", Some(expected.len().to_string()))
    );
    let (status, _, _) = ann.client.get_text(&format!("{path}?offset=-1"), "x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let eve = app.tenant("eve", "10").await;
    let (status, body, _) = eve.client.get_text(&path, "x").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    ann.client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    app.wait_status(&ann.client, &id, "stopped").await;
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(output, output_reaches_the_owner);

async fn published_ports_are_shown_once_running(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_process_node("proc-node", std::time::Duration::from_secs(10))
        .await;
    let t = app.tenant("pia", "10").await;
    let (status, bad) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "ports": [80, 80]}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    let (_, r) = t.client.reserve(json!({"gpu_type": "rtx4090", "hours": 1, "ports": [8888], "command": ["sleep", "300"]})).await;
    assert_eq!(r["ports"], json!([]));
    let id = r["id"].as_str().unwrap().to_owned();
    let running = app.wait_status(&t.client, &id, "running").await;
    // Processes share the node's network: a port is published as itself.
    assert_eq!(
        running["ports"],
        json!([{"container_port": 8888, "host_port": 8888}])
    );
    t.client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    app.wait_status(&t.client, &id, "stopped").await;
    app.shutdown().await;
}
both_stores!(ports, published_ports_are_shown_once_running);
