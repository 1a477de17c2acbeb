//! An agent on the fake NVML (what a real H200 reported) registers the GPU exactly and its
//! heartbeats carry telemetry to `GET /api/v1/nodes`.

use std::path::Path;
use std::sync::Arc;

use gpurent_agent::gpu::FakeNvml;
use gpurent_store::Backend;
use serde_json::json;

use crate::app::TestApp;

#[tokio::test]
async fn h200_inventory_and_telemetry_reach_the_control_plane() {
    let mut app = TestApp::with(Backend::Sqlite).start().await;
    let probe = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/nvidia-h200/nvml-busy.json");
    app.add_node_with("h200-box", Arc::new(FakeNvml::load(&probe).unwrap()))
        .await;

    let t = app.tenant("tom", "100").await;
    let (_, offers) = t.client.get("/api/v1/offers").await;
    assert_eq!(
        (
            &offers[0]["gpu_type"],
            &offers[0]["vram_gb"],
            &offers[0]["available"]
        ),
        (&json!("H200"), &json!(140), &json!(1))
    );
    // Every tier relative to the card's on-demand price; a share per GB of its 143,771 MiB.
    assert_eq!(
        (
            &offers[0]["price_per_hour"],
            &offers[0]["stepped_price_per_hour"],
            &offers[0]["stepped_then_per_hour"],
            &offers[0]["share_price_per_gb_hour"]
        ),
        (
            &json!("9.00"),
            &json!("9.00"),
            &json!("5.40"),
            &json!("0.064102")
        )
    );

    app.eventually("telemetry in nodes ls", || async {
        let (_, nodes) = app.admin().get("/api/v1/nodes").await;
        !nodes[0]["gpus"][0]["telemetry"].is_null()
    })
    .await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let node = &nodes[0];
    assert_eq!(
        (
            node["driver_version"].as_str(),
            node["cuda_version"].as_str()
        ),
        (Some("580.159.04"), Some("13.0"))
    );
    assert_eq!(node["gpu_backend"], "fake-nvml");
    assert_eq!(
        node["gpus"][0],
        json!({
            "uuid": "GPU-cce5198b-9fe5-68bd-b940-5f2b9b9158a4",
            "model": "H200",
            "vram_gb": 140,
            "status": "free",
            "telemetry": {
                "uuid": "GPU-cce5198b-9fe5-68bd-b940-5f2b9b9158a4",
                "utilization_pct": 99,
                "memory_used_mb": 1138,
                "temperature_c": 53,
                "power_mw": 687933,
                "ecc_uncorrected": 0,
                "memory_total_mb": 143771,
                "processes": [{"pid": 472, "used_mb": 1130, "reservation_id": null}]
            }
        })
    );
    app.shutdown().await;
}
