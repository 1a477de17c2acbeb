//! GPU health rules on the fake NVML replaying a real H200 with injected faults: a breach
//! makes the node `unhealthy` (shown with the rule, recorded as an event) and keeps work off it
//! until every GPU passes again.

use std::path::Path;
use std::sync::Arc;

use gpurent_agent::gpu::{FakeNvml, Faults};
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

async fn node_status(app: &TestApp) -> Value {
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    nodes[0].clone()
}

async fn events(app: &TestApp) -> Vec<(String, String)> {
    let (status, events) = app.admin().get("/api/v1/events").await;
    assert_eq!(status, StatusCode::OK, "{events}");
    events
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap_or_default().to_owned(),
                e["detail"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

async fn a_hot_gpu_takes_no_work_until_it_cools(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    let probe = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/nvidia-h200/nvml-idle.json");
    let gpus = Arc::new(FakeNvml::load(&probe).expect("fixture"));
    app.add_node_with("h200-box", gpus.clone()).await;
    let uuid = node_status(&app).await["gpus"][0]["uuid"].clone();

    gpus.inject(Faults {
        temperature_c: Some(91),
        ..Faults::default()
    });
    app.eventually("the node to be unhealthy", || async {
        node_status(&app).await["status"] == "unhealthy"
    })
    .await;
    let node = node_status(&app).await;
    assert_eq!(
        node["health"],
        json!([{"gpu_uuid": uuid, "rule": "temperature", "detail": "91 °C, at or above 85 °C"}])
    );
    let alice = app.tenant("alice", "100").await;
    let (status, body) = alice
        .client
        .reserve(json!({"gpu_type": "h200", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // Cooled down: back in placement.
    gpus.inject(Faults::default());
    app.eventually("the node to be ready", || async {
        node_status(&app).await["status"] == "ready"
    })
    .await;
    let (status, body) = alice
        .client
        .reserve(json!({"gpu_type": "h200", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // A critical XID (79: fallen off the bus) is an event of its own; the GPU lost for good
    // keeps the node out.
    gpus.inject(Faults {
        lost: true,
        xid_errors: vec![79],
        ..Faults::default()
    });
    app.eventually("the node to be unhealthy again", || async {
        node_status(&app).await["status"] == "unhealthy"
    })
    .await;
    let rules: Vec<Value> = node_status(&app).await["health"]
        .as_array()
        .expect("health")
        .iter()
        .map(|h| h["rule"].clone())
        .collect();
    assert_eq!(rules, [json!("lost")]);
    let kinds: Vec<String> = events(&app).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, ["node_unhealthy", "node_healthy", "node_unhealthy"]);
    assert!(events(&app).await[0].1.contains("91 °C"));
    app.shutdown().await;
}
both_stores!(
    a_hot_gpu_takes_no_work_until_it_cools_test,
    a_hot_gpu_takes_no_work_until_it_cools
);

#[tokio::test]
async fn events_are_for_admins_only() {
    let app = TestApp::with(Backend::Sqlite)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let alice = app.tenant("alice", "1").await;
    let (status, _) = alice.client.get("/api/v1/events").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, events) = app.admin().get("/api/v1/events?after=0&limit=5").await;
    assert_eq!((status, events), (StatusCode::OK, json!([])));
    app.shutdown().await;
}

/// Each event is POSTed to the alert webhook as it happens.
#[tokio::test]
async fn events_reach_the_alert_webhook() {
    let got: Arc<std::sync::Mutex<Vec<Value>>> = Arc::default();
    let router = axum::Router::new().route(
        "/alerts",
        axum::routing::post({
            let got = got.clone();
            move |axum::Json(v): axum::Json<Value>| async move {
                got.lock().expect("lock").push(v);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/alerts", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, router).await });

    let mut app = TestApp::with(Backend::Sqlite)
        .with_alert_webhook(url)
        .start()
        .await;
    let probe = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/nvidia-h200/nvml-idle.json");
    let gpus = Arc::new(FakeNvml::load(&probe).expect("fixture"));
    app.add_node_with("h200-box", gpus.clone()).await;
    // Let the alerts start after what existed before (nothing), then breach.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    gpus.inject(Faults {
        ecc_uncorrected: Some(3),
        ..Faults::default()
    });
    app.eventually("the alert", || async {
        !got.lock().expect("lock").is_empty()
    })
    .await;
    let alert = got.lock().expect("lock")[0].clone();
    assert_eq!(alert["kind"], "node_unhealthy", "{alert}");
    assert!(
        alert["detail"]
            .as_str()
            .is_some_and(|d| d.contains("3 uncorrected ECC errors")),
        "{alert}"
    );
    app.shutdown().await;
}

/// Burn-in: an idle node runs the owner's stress command and takes no work meanwhile; between
/// runs it is ready again, and work placed then stops further burn-ins.
#[tokio::test]
async fn an_idle_node_is_burnt_in_and_out_of_placement_meanwhile() {
    let app = TestApp::with(Backend::Sqlite)
        .with_burn_in(gpurent_agent::BurnInConfig {
            command: "sleep 1".into(),
            every: std::time::Duration::from_secs(3),
            length: std::time::Duration::from_secs(5),
        })
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    app.eventually("the burn-in to run", || async {
        node_status(&app).await["status"] == "unhealthy"
    })
    .await;
    let node = node_status(&app).await;
    assert_eq!(
        node["health"],
        json!([{"gpu_uuid": "*", "rule": "burn_in", "detail": "burn-in running"}])
    );
    app.eventually("the burn-in to pass", || async {
        node_status(&app).await["status"] == "ready"
    })
    .await;
    let alice = app.tenant("alice", "100").await;
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().expect("id").to_owned();
    app.wait_status(&alice.client, &id, "running").await;
    // Busy: no burn-in past its period.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert_eq!(node_status(&app).await["status"], "ready");
    let kinds: Vec<String> = events(&app).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds[..2], ["node_unhealthy", "node_healthy"]);
    app.shutdown().await;
}
