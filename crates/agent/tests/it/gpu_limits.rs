//! What instances are told of their GPU memory (issue 17): `GPURENT_VRAM_LIMIT_MB` from the
//! process and the Docker executors, and with MPS a share's MPS client limits, none of which a
//! tenant's environment overrides.

use std::collections::BTreeMap;
use std::time::Duration;

use gpurent_agent::executor::docker::container_name;
use gpurent_agent::executor::{DockerExecutor, GpuLimits, ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::Executor;
use gpurent_types::agent::Assignment;

use crate::support::wait_for;

const SCRIPT: &str = "echo limit=${GPURENT_VRAM_LIMIT_MB:-none} pinned=${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-none} threads=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-none}; sleep 30";

fn limits(mps: bool) -> GpuLimits {
    GpuLimits {
        memory_mb: BTreeMap::from([("GPU-h200".to_owned(), 143_771)]),
        mps,
    }
}

/// A 40 GiB share of the H200 whose tenant tried to lift its own limits.
fn share(id: &str, image: Option<&str>) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch: 1,
        restart_count: 0,
        array_index: None,
        gpus: vec!["GPU-h200".into()],
        vram_mb: Some(40_960),
        image: image.map(str::to_owned),
        command: vec!["sh".into(), "-c".into(), SCRIPT.into()],
        env: [
            ("GPURENT_VRAM_LIMIT_MB".to_owned(), "999999".to_owned()),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
                "0=999999M".to_owned(),
            ),
        ]
        .into(),
        run: true,
        log_offset: 0,
        stop_grace_s: None,
        checkpoint: false,
        secrets: Default::default(),
        sealed_secrets: None,
        ports: vec![],
        mounts: Vec::new(),
    }
}

async fn first_line(e: &dyn Executor, id: &str) -> String {
    for _ in 0..250 {
        let bytes = e.read_output(id, 0, 4096).await.ok().flatten();
        let text = String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned();
        if text.contains('\n') {
            return text.lines().next().unwrap_or_default().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{id} wrote no line in 5 s");
}

#[tokio::test]
async fn a_process_instance_gets_its_share_and_with_mps_its_mps_limits() {
    let dir = tempfile::tempdir().unwrap();
    for (mps, want) in [
        (false, "limit=40960 pinned=none threads=none"),
        (true, "limit=40960 pinned=0=40960M threads=28"),
    ] {
        let e = ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default())
            .unwrap()
            .with_grace(Duration::from_secs(1))
            .with_gpu_limits(limits(mps));
        let id = format!("share-{mps}");
        e.start(&share(&id, None), None).await.unwrap();
        wait_for(&e, &id, ObservedState::Running).await;
        let line = first_line(&e, &id).await;
        e.stop(&id, None).await.unwrap();
        assert_eq!(line, want);
    }
    // A whole GPU: the card's memory.
    let e = ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default())
        .unwrap()
        .with_grace(Duration::from_secs(1))
        .with_gpu_limits(limits(true));
    let mut whole = share("whole", None);
    whole.vram_mb = None;
    e.start(&whole, None).await.unwrap();
    wait_for(&e, "whole", ObservedState::Running).await;
    let line = first_line(&e, "whole").await;
    e.stop("whole", None).await.unwrap();
    assert_eq!(line, "limit=143771 pinned=none threads=none");
}

#[tokio::test]
async fn a_container_gets_its_share_and_with_mps_its_mps_limits() {
    let resources = ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 64,
    };
    let docker = match DockerExecutor::connect(resources, false).await {
        Ok(d) => d,
        Err(e) if std::env::var("GPURENT_TEST_DOCKER").as_deref() == Ok("1") => {
            panic!("GPURENT_TEST_DOCKER=1 but no Docker Engine answers: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no Docker Engine here ({e}); scripts/test.sh starts one");
            return;
        }
    };
    let e = docker
        .scoped(&format!("test-limits-{}", std::process::id()))
        .with_grace(1)
        .with_gpu_limits(limits(true));
    let id = format!("limits-{}", std::process::id());
    e.start(&share(&id, Some("gpurent-test/busybox:latest")), None)
        .await
        .unwrap();
    wait_for(&e, &id, ObservedState::Running).await;
    let env = e
        .docker()
        .inspect_container(&container_name(&id), None)
        .await
        .unwrap()
        .config
        .unwrap()
        .env
        .unwrap();
    let line = first_line(&e, &id).await;
    e.stop(&id, None).await.unwrap();
    e.forget_output(&id, 1).await.unwrap();
    assert_eq!(line, "limit=40960 pinned=0=40960M threads=28");
    assert!(!env.iter().any(|v| v.contains("999999")), "{env:?}");
}
