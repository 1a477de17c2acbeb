//! The Docker executor against a real Docker Engine (started by `scripts/test.sh` with
//! GPURENT_TEST_DOCKER=1) and a local image (`gpurent-test/busybox`, imported from Debian's
//! busybox-static; no registry is needed).

use std::time::{Duration, Instant};

use gpurent_agent::executor::docker::{container_name, LABEL_EPOCH, LABEL_RESERVATION};
use gpurent_agent::executor::{DockerExecutor, ResourcesPerGpu};
use gpurent_agent::reconcile::{Observed, ObservedState};
use gpurent_agent::Executor;
use gpurent_types::agent::Assignment;

use crate::support::{state_of, wait_for};

const IMAGE: &str = "gpurent-test/busybox:latest";

/// The executor, or None (with the reason printed) where this machine has no Docker Engine
/// and the test run did not ask for one.
async fn docker() -> Option<DockerExecutor> {
    let resources = ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 64,
    };
    match DockerExecutor::connect(resources, false).await {
        Ok(d) => Some(
            d.scoped(&format!("test-{}", std::process::id()))
                .with_grace(1),
        ),
        Err(e) if std::env::var("GPURENT_TEST_DOCKER").as_deref() == Ok("1") => {
            panic!("GPURENT_TEST_DOCKER=1 but no Docker Engine answers: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no Docker Engine here ({e}); scripts/test.sh starts one");
            None
        }
    }
}

fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{n:x}")
}

fn assignment(id: &str, script: &str) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch: 3,
        restart_count: 0,
        array_index: None,
        gpus: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
        vram_mb: None,
        image: Some(IMAGE.to_owned()),
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: [("MODEL".to_owned(), "llama".to_owned())].into(),
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

#[tokio::test]
async fn containers_are_confined_and_labelled() {
    let Some(e) = docker().await else { return };
    let id = unique("limits");
    e.start(&assignment(&id, "echo hi; sleep 300"), None)
        .await
        .unwrap();
    wait_for(&e, &id, ObservedState::Running).await;
    let inspect = e
        .docker()
        .inspect_container(&container_name(&id), None)
        .await
        .unwrap();
    let host = inspect.host_config.unwrap();
    // Two GPUs: twice the per-GPU resources.
    assert_eq!(host.memory, Some(512 * 1024 * 1024));
    assert_eq!(host.memory_reservation, Some(384 * 1024 * 1024));
    assert_eq!(host.nano_cpus, Some(2_000_000_000));
    assert_eq!(host.pids_limit, Some(64));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
    assert_eq!(host.cap_add, None);
    assert!(host
        .security_opt
        .unwrap_or_default()
        .iter()
        .any(|o| o == "no-new-privileges"));
    assert_eq!(host.privileged, Some(false));
    assert!(host
        .binds
        .unwrap_or_default()
        .iter()
        .all(|b| !b.contains("docker.sock")));
    // Nothing of the host's namespaces: its own network, process and IPC namespaces.
    assert_eq!(host.network_mode.as_deref(), Some("bridge"));
    assert_eq!(host.pid_mode.as_deref().unwrap_or_default(), "");
    assert_eq!(host.ipc_mode.as_deref(), Some("private"));
    assert_eq!(host.userns_mode.as_deref().unwrap_or_default(), "");
    assert!(host.devices.unwrap_or_default().is_empty());
    let config = inspect.config.unwrap();
    let labels = config.labels.unwrap();
    assert_eq!(labels.get(LABEL_RESERVATION), Some(&id));
    assert_eq!(labels.get(LABEL_EPOCH).map(String::as_str), Some("3"));
    let env = config.env.unwrap();
    assert!(
        env.contains(&"CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb".to_owned()),
        "{env:?}"
    );
    assert!(env.contains(&"MODEL=llama".to_owned()));

    e.stop(&id, None).await.unwrap();
    assert_eq!(state_of(&e, &id).await, None);
    assert!(
        e.docker()
            .inspect_container(&container_name(&id), None)
            .await
            .is_err(),
        "stop must remove the container"
    );
    // Stopping what is gone is fine.
    e.stop(&id, None).await.unwrap();
    e.forget_output(&id, 3).await.unwrap();
}

#[tokio::test]
async fn exit_codes_are_reported() {
    let Some(e) = docker().await else { return };
    let id = unique("exit");
    e.start(&assignment(&id, "exit 3"), None).await.unwrap();
    wait_for(&e, &id, ObservedState::Exited(3)).await;
    e.stop(&id, None).await.unwrap();
    e.forget_output(&id, 3).await.unwrap();
    let mut no_image = assignment(&unique("noimage"), "true");
    no_image.image = None;
    let err = e.start(&no_image, None).await.unwrap_err();
    assert!(err.to_string().contains("needs an image"), "{err}");
    // An image the node lacks is pulled in the background; one no registry has fails then,
    // saying so, and its lines are the instance's output.
    let missing_id = unique("missing");
    let mut missing = assignment(&missing_id, "true");
    missing.image = Some("gpurent-test/does-not-exist:1".into());
    e.start(&missing, None).await.unwrap();
    let mut failed = None;
    for _ in 0..2400 {
        if let Some(ObservedState::Failed(why)) = state_of(&e, &missing_id).await {
            failed = Some(why);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let why = failed.expect("the pull of a missing image fails");
    assert!(
        why.contains("cannot pull image gpurent-test/does-not-exist:1"),
        "{why}"
    );
    let output = e
        .read_output(&missing_id, 0, 1 << 20)
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&output).contains("gpurent: pulling image"));
    assert!(e
        .kept_outputs()
        .await
        .unwrap()
        .contains(&(missing_id.clone(), 3)));
    e.forget_output(&missing_id, 3).await.unwrap();
    assert_eq!(state_of(&e, &missing_id).await, None, "forgotten");
}

#[tokio::test]
async fn a_new_agent_adopts_running_containers() {
    let Some(first) = docker().await else { return };
    let id = unique("adopt");
    first
        .start(&assignment(&id, "sleep 300"), None)
        .await
        .unwrap();
    wait_for(&first, &id, ObservedState::Running).await;
    drop(first);
    let second = docker().await.unwrap();
    let mine: Vec<Observed> = second
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|o| o.reservation_id == id)
        .collect();
    assert_eq!(
        mine,
        vec![Observed {
            reservation_id: id.clone(),
            epoch: 3,
            state: ObservedState::Running,
            pull: None,
        }]
    );
    second.stop(&id, None).await.unwrap();
    second.forget_output(&id, 3).await.unwrap();
}

#[tokio::test]
async fn ports_are_published_on_free_node_ports() {
    let Some(e) = docker().await else { return };
    let id = unique("ports");
    let mut a = assignment(&id, "sleep 300");
    a.ports = vec![8888, 6006];
    e.start(&a, None).await.unwrap();
    wait_for(&e, &id, ObservedState::Running).await;
    let published = e.published_ports(&a).await;
    assert_eq!(
        published
            .iter()
            .map(|p| p.container_port)
            .collect::<Vec<_>>(),
        vec![8888, 6006]
    );
    assert!(published.iter().all(|p| p.host_port > 0), "{published:?}");
    assert_ne!(published[0].host_port, published[1].host_port);
    e.stop(&id, None).await.unwrap();
    e.forget_output(&id, 3).await.unwrap();
}

/// The container's output so far (empty once it is removed).
async fn output_of(e: &DockerExecutor, id: &str) -> String {
    let bytes = e.read_output(id, 0, 1 << 20).await.ok().flatten();
    String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned()
}

/// The grace period of the assignment overrides the executor's (1 s here): the container's
/// main process is told by SIGTERM and killed once the grace period is over.
#[tokio::test]
async fn stop_gives_the_container_its_grace_period_then_kills_it() {
    let Some(e) = docker().await else { return };
    let id = unique("grace");
    e.start(
        &assignment(
            &id,
            "trap 'echo got-term' TERM; echo ready; while true; do sleep 0.1; done",
        ),
        None,
    )
    .await
    .unwrap();
    wait_for(&e, &id, ObservedState::Running).await;
    for _ in 0..200 {
        if output_of(&e, &id).await.contains("ready") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let began = Instant::now();
    // The output goes with the container: it is read while the stop waits.
    let told = async {
        for _ in 0..100 {
            if output_of(&e, &id).await.contains("got-term") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        false
    };
    let (stopped, told) = tokio::join!(e.stop(&id, Some(Duration::from_secs(3))), told);
    let took = began.elapsed();
    stopped.unwrap();
    e.forget_output(&id, 3).await.unwrap();
    assert!(told, "the container was not told by SIGTERM");
    assert!(took >= Duration::from_millis(2500), "killed after {took:?}");
    assert_eq!(state_of(&e, &id).await, None);
}

/// A container sees its checkpoint volume at /checkpoint, writable, and its epoch.
#[tokio::test]
async fn the_checkpoint_volume_is_mounted() {
    let Some(e) = docker().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("volume");
    std::fs::create_dir(&volume).unwrap();
    std::fs::write(volume.join("step"), "41\n").unwrap();
    let id = unique("ckpt");
    let script = r#"n=$(cat "$GPURENT_CHECKPOINT_DIR/step"); echo "epoch $GPURENT_EPOCH at $GPURENT_CHECKPOINT_DIR from $n"; echo $((n + 1)) > "$GPURENT_CHECKPOINT_DIR/step""#;
    e.start(&assignment(&id, script), Some(&volume))
        .await
        .unwrap();
    wait_for(&e, &id, ObservedState::Exited(0)).await;
    assert_eq!(
        output_of(&e, &id).await.trim(),
        "epoch 3 at /checkpoint from 41"
    );
    e.stop(&id, None).await.unwrap();
    e.forget_output(&id, 3).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(volume.join("step")).unwrap().trim(),
        "42"
    );
}

/// The reserved variables are the executor's: a tenant's `CUDA_VISIBLE_DEVICES`,
/// `NVIDIA_VISIBLE_DEVICES` (which the NVIDIA runtime reads to pick the GPUs) or `GPURENT_*`
/// never reaches the container.
#[tokio::test]
async fn reserved_variables_cannot_be_overridden() {
    let Some(e) = docker().await else { return };
    let id = unique("reserved");
    let mut a = assignment(
        &id,
        "echo cuda=$CUDA_VISIBLE_DEVICES nvidia=$NVIDIA_VISIBLE_DEVICES x=${GPURENT_X:-unset}; sleep 300",
    );
    for (k, v) in [
        ("CUDA_VISIBLE_DEVICES", "all"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("GPURENT_X", "1"),
    ] {
        a.env.insert(k.into(), v.into());
    }
    e.start(&a, None).await.unwrap();
    wait_for(&e, &id, ObservedState::Running).await;
    let inspect = e
        .docker()
        .inspect_container(&container_name(&id), None)
        .await
        .unwrap();
    let env = inspect.config.unwrap().env.unwrap();
    let mut output = String::new();
    for _ in 0..250 {
        output = output_of(&e, &id).await;
        if output.contains("x=") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    e.stop(&id, None).await.unwrap();
    e.forget_output(&id, 3).await.unwrap();
    assert!(
        !env.iter()
            .any(|v| v.ends_with("=all") || v.starts_with("GPURENT_X=")),
        "{env:?}"
    );
    assert_eq!(
        output.trim(),
        "cuda=GPU-aaaa,GPU-bbbb nvidia=GPU-aaaa,GPU-bbbb x=unset"
    );
}

/// Agents sharing one Engine (several on a host, or tests side by side) see only their own
/// containers: another agent's plan would stop and remove what it does not know.
#[tokio::test]
async fn agents_on_one_engine_see_only_their_own_containers() {
    let Some(mine) = docker().await else { return };
    let Some(theirs) = docker().await else { return };
    let theirs = theirs.scoped(&unique("other-node"));
    let id = unique("scoped");
    mine.start(&assignment(&id, "sleep 300"), None)
        .await
        .unwrap();
    wait_for(&mine, &id, ObservedState::Running).await;
    let seen_by_them = theirs.list().await.unwrap();
    assert!(
        seen_by_them.iter().all(|o| o.reservation_id != id),
        "another agent's executor lists this one's container: {seen_by_them:?}"
    );
    assert!(mine
        .list()
        .await
        .unwrap()
        .iter()
        .any(|o| o.reservation_id == id));
    let inspect = mine
        .docker()
        .inspect_container(&container_name(&id), None)
        .await
        .unwrap();
    let labels = inspect.config.unwrap().labels.unwrap();
    assert_eq!(
        labels.get(gpurent_agent::executor::docker::LABEL_SCOPE),
        Some(&format!("test-{}", std::process::id()))
    );
    mine.stop(&id, Some(Duration::from_secs(1))).await.unwrap();
    mine.forget_output(&id, 3).await.unwrap();
}
