//! Host verification at join: a node whose GPU links narrower than it can is shown with the
//! failed check and gets no work; a healthy node next to it does.

use std::sync::Arc;

use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{AgentError, GpuBackend};
use gpurent_server::HostPolicy;
use gpurent_store::Backend;
use gpurent_types::agent::{GpuInfo, NodeTelemetry};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

/// Simulated GPUs whose PCIe links are at x`width` of x16 (gen 4 of 4).
#[derive(Debug)]
struct Links {
    gpus: SimGpus,
    width: u32,
}

impl GpuBackend for Links {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, AgentError> {
        Ok(self
            .gpus
            .discover()?
            .into_iter()
            .map(|g| GpuInfo {
                pcie_gen: Some(4),
                pcie_gen_max: Some(4),
                pcie_width: Some(self.width),
                pcie_width_max: Some(16),
                ..g
            })
            .collect())
    }

    fn sample(&self) -> Result<NodeTelemetry, AgentError> {
        Ok(NodeTelemetry {
            driver_version: Some("580.95.05".into()),
            cuda_version: Some("13.0".into()),
            ..self.gpus.sample()?
        })
    }
}

fn links(name: &str, width: u32) -> Arc<Links> {
    Arc::new(Links {
        gpus: SimGpus::parse("1xRTX4090", name).expect("spec"),
        width,
    })
}

fn node<'a>(nodes: &'a Value, name: &str) -> &'a Value {
    nodes
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == name))
        .expect("the node")
}

async fn a_narrow_link_keeps_the_node_out(backend: Backend) {
    let mut app = TestApp::with(backend)
        .with_host_policy(HostPolicy {
            min_cuda: Some("12.4".into()),
            min_disk_free_gb: 0,
            ..HostPolicy::default()
        })
        .start()
        .await;
    app.add_node_with("narrow", links("narrow", 8)).await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let narrow = node(&nodes, "narrow");
    assert_eq!(narrow["status"], "unverified", "{narrow}");
    assert_eq!(narrow["verification"]["ok"], false);
    let failed: Vec<&Value> = narrow["verification"]["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["ok"] == false)
        .collect();
    assert_eq!(
        failed,
        [&json!({"name": "pcie:0", "ok": false, "detail": "GPU 0 links at x8 of x16"})]
    );

    let alice = app.tenant("alice", "100").await;
    let (status, body) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    app.add_node_with("healthy", links("healthy", 16)).await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let healthy = node(&nodes, "healthy");
    assert_eq!(healthy["status"], "ready", "{healthy}");
    assert_eq!(healthy["verification"]["ok"], true);
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["node"], "healthy", "{r}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    a_narrow_link_keeps_the_node_out_test,
    a_narrow_link_keeps_the_node_out
);
