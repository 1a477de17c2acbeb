//! The agent's `/metrics` over HTTP, with the GPU an H200 reported through NVML and a real
//! process of a reservation on it: dcgm-exporter's names, labels and units, the reservation's
//! GPU, and the time of the last sync.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpurent_agent::executor::{ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::gpu::FakeNvml;
use gpurent_agent::{Agent, AgentConfig, Executor, NodeIdentity, RetryPolicy};
use gpurent_types::agent::InstanceState;
use tokio::sync::watch;

use crate::agent::{assignment, reports, ControlPlane};

const H200: &str = "GPU-cce5198b-9fe5-68bd-b940-5f2b9b9158a4";

async fn scrape(addr: std::net::SocketAddr) -> String {
    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|c| c.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    response.text().await.unwrap()
}

#[tokio::test]
async fn the_agent_serves_its_gpus_and_reservations_from_the_heartbeat_sample() {
    let (cp, base) = ControlPlane::serve().await;
    let dir = tempfile::tempdir().unwrap();
    NodeIdentity {
        node_id: "node-1".into(),
        node_token: "gpn-test".into(),
        name: "h200-box".into(),
    }
    .save(dir.path())
    .unwrap();
    let mut config = AgentConfig::new(&base, dir.path().to_owned(), "h200-box");
    config.heartbeat = Duration::from_millis(200);
    config.retry = RetryPolicy {
        tries: 3,
        delay: Duration::from_millis(100),
    };
    let probe =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia-h200/nvml-busy.json");
    let gpus = Arc::new(FakeNvml::load(&probe).unwrap());
    let executor = Arc::new(
        ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default())
            .unwrap()
            .with_grace(Duration::from_secs(1)),
    );
    cp.set(vec![assignment("r1", &[H200], "echo ready; sleep 300")]);
    let agent = Agent::new(config, gpus, executor.clone());
    let (shutdown, stopped) = watch::channel(false);
    let (addr, server) = gpurent_agent::metrics::serve(
        "127.0.0.1:0".parse().unwrap(),
        agent.metrics(),
        stopped.clone(),
    )
    .await
    .unwrap();

    // Before the first heartbeat: the families, no samples.
    let before = scrape(addr).await;
    assert!(before.contains("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"));
    assert!(!before.contains("DCGM_FI_DEV_GPU_UTIL{"), "{before}");

    let running = tokio::spawn(agent.run(stopped));
    cp.first_sync("r1 running", |r| reports(r, "r1", InstanceState::Running))
        .await;
    let mut text = String::new();
    for _ in 0..200 {
        text = scrape(addr).await;
        if text.contains("reservation=\"r1\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let labels = format!(
        "gpu=\"0\",UUID=\"{H200}\",device=\"nvidia0\",modelName=\"NVIDIA H200\",Hostname=\"h200-box\""
    );
    // What NVML reported under load: 99%, 1138 of 143771 MiB, 53 °C, 687.933 W, no ECC error.
    for line in [
        format!("DCGM_FI_DEV_GPU_UTIL{{{labels}}} 99"),
        format!("DCGM_FI_DEV_FB_USED{{{labels}}} 1138"),
        format!("DCGM_FI_DEV_FB_FREE{{{labels}}} 142633"),
        format!("DCGM_FI_DEV_GPU_TEMP{{{labels}}} 53"),
        format!("DCGM_FI_DEV_POWER_USAGE{{{labels}}} 687.933"),
        format!("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{labels}}} 0"),
        // The probe's process is not the reservation's: its GPU, with nothing of its own on it.
        format!(
            "gpurent_reservation_gpu_memory_used_bytes{{reservation=\"r1\",UUID=\"{H200}\",gpu=\"0\"}} 0"
        ),
        format!(
            "gpurent_reservation_gpu_utilization_percent{{reservation=\"r1\",UUID=\"{H200}\",gpu=\"0\"}} 99"
        ),
    ] {
        assert!(text.contains(&format!("{line}\n")), "{line} not in\n{text}");
    }
    assert!(text.contains("\ngpurent_agent_last_sync_timestamp_seconds 1"));
    assert!(text.contains("\ngpurent_agent_telemetry_timestamp_seconds 1"));

    shutdown.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    server.await.unwrap();
    executor
        .stop("r1", Some(Duration::from_secs(1)))
        .await
        .unwrap();
}
