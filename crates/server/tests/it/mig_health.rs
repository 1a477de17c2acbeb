//! The health rules on a GPU with MIG on: a fault of the physical GPU is a breach of every MIG
//! device of it, and keeps work off all of them until it clears.

use std::path::Path;
use std::sync::Arc;

use gpurent_agent::gpu::{FakeNvml, Faults};
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

async fn node(app: &TestApp) -> Value {
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    nodes[0].clone()
}

async fn an_ecc_error_of_a_mig_gpu_takes_all_its_units_out(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    let probe = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/nvidia-h200/nvml-mig.json");
    let gpus = Arc::new(FakeNvml::load(&probe).expect("fixture"));
    app.add_node_with("h200-mig", gpus.clone()).await;
    let units: Vec<Value> = node(&app).await["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["uuid"].clone())
        .collect();
    assert_eq!(units.len(), 4, "{units:?}");

    gpus.inject(Faults {
        ecc_uncorrected: Some(1),
        ..Faults::default()
    });
    app.eventually("the node to be unhealthy", || async {
        node(&app).await["status"] == "unhealthy"
    })
    .await;
    let health = node(&app).await["health"].clone();
    let breached: Vec<Value> = health
        .as_array()
        .expect("health")
        .iter()
        .filter(|h| h["rule"] == "ecc")
        .map(|h| h["gpu_uuid"].clone())
        .collect();
    assert_eq!(breached, units, "{health}");
    let alice = app.tenant("alice", "100").await;
    let (status, body) = alice
        .client
        .reserve(json!({"gpu_type": "H200 MIG 1g.18gb", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    gpus.inject(Faults::default());
    app.eventually("the node to be ready", || async {
        node(&app).await["status"] == "ready"
    })
    .await;
    let (status, body) = alice
        .client
        .reserve(json!({"gpu_type": "H200 MIG 1g.18gb", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["gpu_type"], "H200-MIG-1G.18GB", "{body}");
}

both_stores!(
    an_ecc_error_of_a_mig_gpu_takes_all_its_units_out_test,
    an_ecc_error_of_a_mig_gpu_takes_all_its_units_out
);
