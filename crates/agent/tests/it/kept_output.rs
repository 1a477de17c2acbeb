//! What a stop keeps of an instance's output (issue 14): all it wrote, its TERM trap's last
//! words too, readable after the instance is gone and listed with its epoch until the agent
//! forgets it; with the process executor (unisolated, and isolated: the kept log is never the
//! instance uid's, so a later instance with that uid cannot touch it) and the Docker executor.

use std::path::Path;
use std::time::Duration;

use gpurent_agent::executor::docker::{container_name, kept_name};
use gpurent_agent::executor::{
    DockerExecutor, Isolation, ProcessExecutor, ResourcesPerGpu, DEFAULT_INSTANCE_UID_BASE,
};
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::Executor;
use gpurent_types::agent::Assignment;

use crate::support::{state_of, wait_for};

const LAST_WORDS: &str =
    "trap 'echo LAST-WORDS; exit 0' TERM; echo started; while :; do sleep 0.1; done";

fn assignment(id: &str, epoch: i64, command: Vec<String>) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch,
        restart_count: 0,
        array_index: None,
        gpus: vec!["GPU-aaaa".into()],
        vram_mb: None,
        image: None,
        command,
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

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

/// The instance's output, less the shell's `Terminated` lines (dash says so of a `sleep` the
/// stop's SIGTERM killed): what the script printed.
async fn printed(e: &dyn Executor, id: &str) -> Option<String> {
    let bytes = e.read_output(id, 0, 1 << 20).await.unwrap()?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Some(
        text.split_inclusive('\n')
            .filter(|l| *l != "Terminated\n")
            .collect(),
    )
}

/// Waits (up to 10 s) until the instance has printed `started`.
async fn started(e: &dyn Executor, id: &str) {
    for _ in 0..400 {
        if printed(e, id)
            .await
            .is_some_and(|o| o.starts_with("started"))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{id} never printed `started`: {:?}", printed(e, id).await);
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|es| {
            es.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The repro: the process executor removed the instance directory, output.log and all, so
/// what the instance wrote in its grace period was gone before the agent could ship it.
#[tokio::test]
async fn a_stop_keeps_the_output_until_it_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let e = ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default())
        .unwrap()
        .with_grace(Duration::from_secs(5));
    e.start(&assignment("r1", 4, sh(LAST_WORDS)), None)
        .await
        .unwrap();
    started(&e, "r1").await;
    e.stop("r1", None).await.unwrap();
    assert_eq!(state_of(&e, "r1").await, None);
    assert!(!dir.path().join("instances/r1").exists());
    let kept = printed(&e, "r1").await;
    assert_eq!(
        kept.as_deref(),
        Some("started\nLAST-WORDS\n"),
        "the output of a stopped instance"
    );
    let size = e.output_size("r1").await.unwrap();
    assert!(size >= Some(19), "{size:?}");
    assert_eq!(e.kept_outputs().await.unwrap(), vec![("r1".to_owned(), 4)]);

    // The next epoch's own output is read while it runs, not the kept one; its stop keeps
    // its output in place of the earlier.
    e.start(&assignment("r1", 5, sh("echo next; exit 0")), None)
        .await
        .unwrap();
    wait_for(&e, "r1", ObservedState::Exited(0)).await;
    assert_eq!(printed(&e, "r1").await.as_deref(), Some("next\n"));
    e.stop("r1", None).await.unwrap();
    assert_eq!(e.kept_outputs().await.unwrap(), vec![("r1".to_owned(), 5)]);
    assert_eq!(printed(&e, "r1").await.as_deref(), Some("next\n"));

    // Forgetting another epoch's leaves it.
    e.forget_output("r1", 4).await.unwrap();
    assert_eq!(e.kept_outputs().await.unwrap(), vec![("r1".to_owned(), 5)]);
    e.forget_output("r1", 5).await.unwrap();
    assert!(e.kept_outputs().await.unwrap().is_empty());
    assert_eq!(e.read_output("r1", 0, 100).await.unwrap(), None);
    assert!(
        entries(&dir.path().join("instances")).is_empty(),
        "{:?}",
        entries(&dir.path().join("instances"))
    );
    // Forgetting what is not kept is fine.
    e.forget_output("r1", 5).await.unwrap();
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Isolated: the kept log stays the agent's (never the instance uid's), and the next instance
/// that runs as the same uid can neither write to nor read it.
#[tokio::test]
async fn a_kept_log_is_out_of_reach_of_the_next_instance_with_its_uid() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let uid_base = DEFAULT_INSTANCE_UID_BASE + 112_000;
    let isolation = Isolation {
        cgroup_root: "/sys/fs/cgroup/gpurent-test".into(),
        uid_base,
        allow_unisolated: false,
        hidden: vec![],
    };
    let e = match ProcessExecutor::isolated(dir.path(), &isolation, ResourcesPerGpu::default()) {
        Ok(e) => e.with_grace(Duration::from_secs(5)),
        Err(why) if !running_as_root() => {
            eprintln!("SKIPPED: not root, so no isolation to test: {why}");
            return;
        }
        Err(why) if std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") => {
            eprintln!("SKIPPED: GPURENT_TEST_ISOLATION=0: {why}");
            return;
        }
        Err(why) => panic!("root, yet no isolation (GPURENT_TEST_ISOLATION=0 skips): {why}"),
    };
    let instances = dir.path().join("instances");
    e.start(&assignment("first", 1, sh(LAST_WORDS)), None)
        .await
        .unwrap();
    started(&e, "first").await;
    e.stop("first", None).await.unwrap();
    assert_eq!(
        printed(&e, "first").await.as_deref(),
        Some("started\nLAST-WORDS\n")
    );
    let kept = instances.join("first.1.log");
    let meta = std::fs::metadata(&kept).unwrap();
    assert_eq!(meta.uid(), 0, "the kept log's owner");
    assert_eq!(
        meta.mode() & 0o077,
        0,
        "the kept log's mode: {:o}",
        meta.mode()
    );
    assert!(
        !(uid_base..uid_base + 1024).contains(&meta.gid()),
        "group {}",
        meta.gid()
    );
    // The next instance gets the lowest free uid: the one `first` ran as.
    let mut next = assignment(
        "next",
        1,
        sh(r#"id -u; echo TAMPERED >> "$KEPT"; cat "$KEPT" ../first.1.log; echo done"#),
    );
    next.env
        .insert("KEPT".into(), kept.to_string_lossy().into_owned());
    e.start(&next, None).await.unwrap();
    wait_for(&e, "next", ObservedState::Exited(0)).await;
    let said = printed(&e, "next").await.unwrap_or_default();
    assert!(said.contains("done"), "{said}");
    assert!(said.starts_with(&uid_base.to_string()), "{said}");
    assert!(!said.contains("LAST-WORDS"), "it read the kept log: {said}");
    e.stop("next", None).await.unwrap();
    let content = std::fs::read_to_string(&kept).unwrap();
    assert!(
        !content.contains("TAMPERED"),
        "the next instance wrote to the kept log: {content:?}"
    );
    for id in ["first", "next"] {
        e.forget_output(id, 1).await.unwrap();
    }
    assert!(entries(&instances).is_empty(), "{:?}", entries(&instances));
}

const IMAGE: &str = "gpurent-test/busybox:latest";

fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{n:x}")
}

/// The Docker executor keeps a stopped container, renamed and out of `list`, until its
/// output is forgotten.
#[tokio::test]
async fn docker_keeps_a_stopped_container_until_its_output_is_forgotten() {
    let resources = ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 64,
    };
    let e = match DockerExecutor::connect(resources, false).await {
        Ok(d) => d
            .scoped(&format!("test-{}", std::process::id()))
            .with_grace(5),
        Err(e) if std::env::var("GPURENT_TEST_DOCKER").as_deref() == Ok("1") => {
            panic!("GPURENT_TEST_DOCKER=1 but no Docker Engine answers: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no Docker Engine here ({e}); scripts/test.sh starts one");
            return;
        }
    };
    let id = unique("kept");
    let mut a = assignment(&id, 2, sh(LAST_WORDS));
    a.image = Some(IMAGE.to_owned());
    e.start(&a, None).await.unwrap();
    started(&e, &id).await;
    e.stop(&id, None).await.unwrap();
    assert_eq!(state_of(&e, &id).await, None);
    assert!(e
        .docker()
        .inspect_container(&container_name(&id), None)
        .await
        .is_err());
    assert_eq!(
        printed(&e, &id).await.as_deref(),
        Some("started\nLAST-WORDS\n")
    );
    let kept = e.kept_outputs().await.unwrap();
    assert!(kept.contains(&(id.clone(), 2)), "{kept:?}");
    // A start of the reservation again is not hindered by the kept container.
    let mut again = assignment(&id, 3, sh("echo again"));
    again.image = Some(IMAGE.to_owned());
    e.start(&again, None).await.unwrap();
    wait_for(&e, &id, ObservedState::Exited(0)).await;
    e.stop(&id, None).await.unwrap();
    // The kept container is the later epoch's now: forgetting the earlier leaves it.
    e.forget_output(&id, 2).await.unwrap();
    let kept = e.kept_outputs().await.unwrap();
    assert!(kept.contains(&(id.clone(), 3)), "{kept:?}");
    e.forget_output(&id, 3).await.unwrap();
    assert!(!e
        .kept_outputs()
        .await
        .unwrap()
        .iter()
        .any(|(r, _)| r == &id));
    assert!(e
        .docker()
        .inspect_container(&kept_name(&id), None)
        .await
        .is_err());
    assert_eq!(e.read_output(&id, 0, 100).await.unwrap(), None);
}
