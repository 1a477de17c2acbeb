//! The executor `auto` picks where Docker answers: an instance with an image in a real
//! container, one without in a real process (isolated where this host can), each reservation's
//! output, processes, sessions and stop found in the executor that runs it, and both adopted
//! by a restarted agent.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpurent_agent::entry::{EntryKind, EntryRequest};
use gpurent_agent::executor::{
    ByImageExecutor, DockerExecutor, Isolation, ProcessExecutor, ResourcesPerGpu,
};
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::Executor;
use gpurent_types::agent::Assignment;
use tokio::io::AsyncReadExt;

use crate::support::{state_of, wait_for};

const IMAGE: &str = "gpurent-test/busybox:latest";

fn resources() -> ResourcesPerGpu {
    ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 64,
    }
}

fn assignment(id: &str, image: Option<&str>, script: &str) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch: 2,
        restart_count: 0,
        array_index: None,
        gpus: vec!["GPU-aaaa".into()],
        vram_mb: None,
        image: image.map(str::to_owned),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: Default::default(),
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

fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{n:x}")
}

/// The Docker executor of this test's scope, or None (saying why) without an Engine.
async fn docker_executor(scope: &str) -> Option<Arc<DockerExecutor>> {
    match DockerExecutor::connect(resources(), false).await {
        Ok(d) => Some(Arc::new(d.scoped(scope).with_grace(1))),
        Err(e) if std::env::var("GPURENT_TEST_DOCKER").as_deref() == Ok("1") => {
            panic!("GPURENT_TEST_DOCKER=1 but no Docker Engine answers: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no Docker Engine here ({e}); scripts/test.sh starts one");
            None
        }
    }
}

/// The process executor over `dir`: isolated where this host can (root, bubblewrap, cgroups),
/// else unisolated (what routes where is the same).
fn processes(dir: &Path) -> Arc<ProcessExecutor> {
    let isolation = Isolation {
        cgroup_root: "/sys/fs/cgroup/gpurent-test".into(),
        uid_base: 312_000,
        allow_unisolated: false,
        hidden: vec![],
    };
    let e = match ProcessExecutor::isolated(dir, &isolation, resources()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("the process part runs unisolated here: {e}");
            ProcessExecutor::unisolated(dir, None, resources()).unwrap()
        }
    };
    Arc::new(e.with_grace(Duration::from_secs(1)))
}

/// The pids of the host whose command line is `needle` (the container's processes too).
fn processes_with(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).replace('\0', " ").trim() == needle
        })
        .collect()
}

/// Stops both instances and forgets their outputs, even when the test fails.
struct Cleanup(Arc<dyn Executor>, Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let e = self.0.clone();
        let ids = std::mem::take(&mut self.1);
        // A runtime of its own: this runs while the test's runtime unwinds.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                for id in ids {
                    let _ = e.stop(&id, Some(Duration::from_secs(1))).await;
                    let _ = e.forget_output(&id, 2).await;
                }
            });
        })
        .join();
    }
}

/// What `sh -c COMMAND` entered in the instance prints.
async fn exec_in(e: &dyn Executor, id: &str, command: &str) -> String {
    let request = EntryRequest {
        kind: EntryKind::Exec {
            command: command.to_owned(),
        },
        pty: None,
        env: vec![],
    };
    let mut s = e
        .enter(id, request)
        .await
        .unwrap_or_else(|err| panic!("enter {id}: {err}"));
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(20), s.stdout.read_to_string(&mut out))
        .await
        .expect("the session's output within 20 s")
        .unwrap();
    out
}

/// Polls until the instance's output holds `want` (10 s at most); the output then.
async fn output_with(e: &dyn Executor, id: &str, want: &str) -> String {
    let mut text = String::new();
    for _ in 0..400 {
        let bytes = e.read_output(id, 0, 1 << 20).await.unwrap();
        text = String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned();
        if text.contains(want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    text
}

#[tokio::test]
async fn an_image_runs_in_a_container_and_no_image_in_a_process() {
    let scope = unique("byimage");
    let Some(docker) = docker_executor(&scope).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let e: Arc<dyn Executor> = Arc::new(ByImageExecutor::new(
        docker.clone(),
        processes(&dir.path().join("node")),
    ));
    assert_eq!(e.name(), "docker+process");
    assert!(e.runs_containers());
    let boxed = unique("boxed");
    let plain = unique("plain");
    let _cleanup = Cleanup(e.clone(), vec![boxed.clone(), plain.clone()]);
    e.start(
        &assignment(&boxed, Some(IMAGE), "echo from-box; exec sleep 31415"),
        None,
    )
    .await
    .unwrap();
    e.start(
        &assignment(&plain, None, "echo from-process; exec sleep 27182"),
        None,
    )
    .await
    .unwrap();
    wait_for(e.as_ref(), &boxed, ObservedState::Running).await;
    wait_for(e.as_ref(), &plain, ObservedState::Running).await;

    // Only the reservation with an image has a container.
    let container_of = |id: &str| {
        let out = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=io.gpurent.reservation={id}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert!(!container_of(&boxed).is_empty(), "no container for {boxed}");
    assert_eq!(container_of(&plain), "", "a container for {plain}");
    assert_eq!(state_of(docker.as_ref(), &plain).await, None);

    // Each reservation's own output, from the executor that runs it.
    let box_output = output_with(e.as_ref(), &boxed, "from-box").await;
    assert!(box_output.contains("from-box"), "{box_output:?}");
    assert!(!box_output.contains("from-process"), "{box_output:?}");
    let plain_output = output_with(e.as_ref(), &plain, "from-process").await;
    assert_eq!(plain_output, "from-process\n");
    assert!(e.output_size(&boxed).await.unwrap().is_some());
    assert_eq!(
        e.output_size(&plain).await.unwrap(),
        Some("from-process\n".len() as u64)
    );
    assert_eq!(e.read_output("nobody", 0, 100).await.unwrap(), None);

    // Telemetry finds the owner of a process of either kind.
    let in_process = processes_with("sleep 27182");
    assert_eq!(in_process.len(), 1, "{in_process:?}");
    assert_eq!(e.owner_of(in_process[0]).await.as_deref(), Some(&*plain));
    let in_container = processes_with("sleep 31415");
    assert_eq!(in_container.len(), 1, "{in_container:?}");
    assert_eq!(e.owner_of(in_container[0]).await.as_deref(), Some(&*boxed));
    assert_eq!(e.owner_of(std::process::id()).await, None);

    // A session enters each in the executor that runs it.
    assert_eq!(
        exec_in(e.as_ref(), &plain, "echo in-$GPURENT_RESERVATION_ID").await,
        format!("in-{plain}\n")
    );
    assert_eq!(
        exec_in(e.as_ref(), &boxed, "echo in-$GPURENT_RESERVATION_ID").await,
        format!("in-{boxed}\n")
    );
    let nothing = e
        .enter(
            "nobody",
            EntryRequest {
                kind: EntryKind::Shell,
                pty: None,
                env: vec![],
            },
        )
        .await;
    assert!(
        matches!(
            nothing,
            Err(gpurent_agent::entry::EntryError::NotRunning { .. })
        ),
        "{nothing:?}"
    );

    // A restarted agent (new executors over the same data dir and scope) adopts both.
    let restarted: Arc<dyn Executor> = Arc::new(ByImageExecutor::new(
        docker_executor(&scope).await.unwrap(),
        processes(&dir.path().join("node")),
    ));
    let mut adopted: Vec<_> = restarted
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.reservation_id, o.epoch, o.state))
        .collect();
    adopted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want = vec![
        (boxed.clone(), 2, ObservedState::Running),
        (plain.clone(), 2, ObservedState::Running),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(adopted, want);

    // A stop ends the one it names, and its output is kept until forgotten.
    restarted.stop(&plain, None).await.unwrap();
    assert_eq!(state_of(restarted.as_ref(), &plain).await, None);
    assert_eq!(
        state_of(restarted.as_ref(), &boxed).await,
        Some(ObservedState::Running)
    );
    assert!(processes_with("sleep 27182").is_empty());
    assert_eq!(processes_with("sleep 31415").len(), 1);
    restarted.stop(&boxed, None).await.unwrap();
    assert!(restarted.list().await.unwrap().is_empty());
    let mut kept = restarted.kept_outputs().await.unwrap();
    kept.sort();
    let mut want = vec![(boxed.clone(), 2), (plain.clone(), 2)];
    want.sort();
    assert_eq!(kept, want);
    let kept_box = output_with(restarted.as_ref(), &boxed, "from-box").await;
    assert!(kept_box.contains("from-box"), "{kept_box:?}");
    assert_eq!(
        output_with(restarted.as_ref(), &plain, "from-process").await,
        "from-process\n"
    );
    for id in [&boxed, &plain] {
        restarted.forget_output(id, 2).await.unwrap();
    }
    assert!(restarted.kept_outputs().await.unwrap().is_empty());
    assert_eq!(container_of(&boxed), "");
    // Stopping what is gone is not an error.
    restarted.stop(&boxed, None).await.unwrap();
    restarted.stop(&plain, None).await.unwrap();
}
