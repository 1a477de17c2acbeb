//! The process executor: start, observe, exit codes, stop, adoption after an agent restart,
//! environment isolation and, where possible, cgroup v2 limits.

use std::path::Path;
use std::time::{Duration, Instant};

use gpurent_agent::executor::{ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::reconcile::{Observed, ObservedState};
use gpurent_agent::Executor;
use gpurent_types::agent::Assignment;

use crate::support::{read_pid, state_of, wait_for};

fn assignment(id: &str, script: &str) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch: 7,
        restart_count: 0,
        array_index: None,
        gpus: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
        vram_mb: None,
        image: None,
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
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

fn executor(dir: &Path) -> ProcessExecutor {
    ProcessExecutor::unisolated(dir, None, ResourcesPerGpu::default())
        .unwrap()
        .with_grace(Duration::from_secs(2))
}

fn alive(pid: i32) -> bool {
    // Not a zombie: its state (after the name in parentheses) is not `Z`. (Its command line,
    // read instead before, is briefly empty while it execs.)
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}

#[tokio::test]
async fn runs_with_its_gpus_and_only_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let e = executor(dir.path());
    // Cargo runs tests with CARGO_PKG_NAME in their environment: the workload must not see it.
    assert!(std::env::var("CARGO_PKG_NAME").is_ok());
    e.start(&assignment("r1", "echo visible=$CUDA_VISIBLE_DEVICES model=$MODEL id=$GPURENT_RESERVATION_ID leaked=${CARGO_PKG_NAME:-none}; sleep 30"), None).await.unwrap();
    wait_for(&e, "r1", ObservedState::Running).await;
    let mut output = String::new();
    for _ in 0..100 {
        output = std::fs::read_to_string(e.output_path("r1")).unwrap_or_default();
        if !output.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        output.trim(),
        "visible=GPU-aaaa,GPU-bbbb model=llama id=r1 leaked=none"
    );
    let listed = e.list().await.unwrap();
    assert_eq!(
        listed,
        vec![Observed {
            reservation_id: "r1".into(),
            epoch: 7,
            state: ObservedState::Running,
            pull: None,
        }]
    );
    e.stop("r1", None).await.unwrap();
    assert_eq!(state_of(&e, "r1").await, None);
    assert!(!dir.path().join("instances/r1").exists());
}

#[tokio::test]
async fn exit_codes_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let e = executor(dir.path());
    e.start(&assignment("ok", "exit 0"), None).await.unwrap();
    e.start(&assignment("bad", "exit 3"), None).await.unwrap();
    let mut missing = assignment("missing", "");
    missing.command = vec!["/nonexistent/program".into()];
    e.start(&missing, None).await.unwrap();
    wait_for(&e, "ok", ObservedState::Exited(0)).await;
    wait_for(&e, "bad", ObservedState::Exited(3)).await;
    wait_for(&e, "missing", ObservedState::Exited(127)).await;
    for id in ["ok", "bad", "missing"] {
        e.stop(id, None).await.unwrap();
    }
    assert!(e.list().await.unwrap().is_empty());
}

/// A job that asks for an image is refused, saying why, rather than run on the node's own
/// system instead of its image; nothing of it is left running.
#[tokio::test]
async fn an_image_is_refused_rather_than_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let e = executor(dir.path());
    let mut boxed = assignment("boxed", "echo ran > ran");
    boxed.image = Some("pytorch/pytorch:2.5".into());
    let err = e.start(&boxed, None).await.unwrap_err().to_string();
    assert!(
        err.contains("the image pytorch/pytorch:2.5 cannot run here")
            && err.contains("reserve without --image"),
        "{err}"
    );
    assert!(e.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn stop_ends_the_whole_process_group_even_when_it_ignores_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let e = executor(dir.path());
    e.start(
        &assignment(
            "stubborn",
            "trap '' TERM; sleep 300 & echo $! > child.pid; wait",
        ),
        None,
    )
    .await
    .unwrap();
    wait_for(&e, "stubborn", ObservedState::Running).await;
    let child = read_pid(&e.home_path("stubborn").join("child.pid")).await;
    assert!(alive(child));
    e.stop("stubborn", None).await.unwrap();
    for _ in 0..50 {
        if !alive(child) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !alive(child),
        "the workload's child process survived the stop"
    );
}

/// A preempted spot instance's notice: SIGTERM, then SIGKILL once the grace period of its
/// assignment is over (which overrides the executor's default).
#[tokio::test]
async fn stop_gives_the_workload_its_grace_period_then_kills_it() {
    let dir = tempfile::tempdir().unwrap();
    let e = ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default())
        .unwrap()
        .with_grace(Duration::from_secs(60));
    let marker = dir.path().join("got-term");
    let mut a = assignment(
        "spot",
        r#"trap 'echo got-term > "$MARKER"' TERM; echo $$ > "$MARKER.pid"; while true; do sleep 0.1; done"#,
    );
    a.env
        .insert("MARKER".into(), marker.to_string_lossy().into_owned());
    e.start(&a, None).await.unwrap();
    // Written once the trap is set.
    let shell = read_pid(&dir.path().join("got-term.pid")).await;
    let began = Instant::now();
    e.stop("spot", Some(Duration::from_secs(2))).await.unwrap();
    let took = began.elapsed();
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default().trim(),
        "got-term",
        "the workload was not told by SIGTERM"
    );
    assert!(took >= Duration::from_millis(1500), "killed after {took:?}");
    assert!(
        took < Duration::from_secs(30),
        "the executor's default grace was used: {took:?}"
    );
    assert!(!alive(shell), "the workload outlived its grace period");
    assert_eq!(state_of(&e, "spot").await, None);
}

#[tokio::test]
async fn a_restarted_agent_adopts_running_instances() {
    let dir = tempfile::tempdir().unwrap();
    let first = executor(dir.path());
    first
        .start(&assignment("long", "sleep 300"), None)
        .await
        .unwrap();
    wait_for(&first, "long", ObservedState::Running).await;
    // The agent dies (its executor is dropped without stopping anything) and a new one starts
    // over the same data dir.
    drop(first);
    let second = executor(dir.path());
    let adopted = second.list().await.unwrap();
    assert_eq!(
        adopted,
        vec![Observed {
            reservation_id: "long".into(),
            epoch: 7,
            state: ObservedState::Running,
            pull: None,
        }]
    );
    second.stop("long", None).await.unwrap();
    assert!(second.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn gpu_processes_are_attributed_to_their_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let e = executor(dir.path());
    e.start(
        &assignment("owner", "sleep 300 & echo $! > child.pid; wait"),
        None,
    )
    .await
    .unwrap();
    let child = read_pid(&e.home_path("owner").join("child.pid")).await;
    assert_eq!(
        e.owner_of(u32::try_from(child).unwrap()).await.as_deref(),
        Some("owner")
    );
    assert_eq!(e.owner_of(std::process::id()).await, None);
    e.stop("owner", None).await.unwrap();
}

/// Real cgroup limits: v2 where the cgroup v2 tree is mounted and writable (as on most GPU
/// hosts), else v1 (the memory, cpu and pids hierarchies); elsewhere the test says why it did
/// not run.
#[tokio::test]
async fn cgroup_limits_are_applied_where_a_cgroup_tree_is_writable() {
    let root = Path::new("/sys/fs/cgroup/gpurent-test");
    let probe = gpurent_agent::executor::CgroupRoot::prepare(root);
    let version = match probe {
        Ok(cg) => cg.version(),
        Err(why) => {
            eprintln!("SKIPPED: no writable cgroup tree here: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let resources = ResourcesPerGpu {
        milli_cpus: 2000,
        memory_mb: 512,
        pids: 64,
    };
    let e = ProcessExecutor::unisolated(dir.path(), Some(root), resources).unwrap();
    assert!(e.is_confined());
    assert_eq!(e.cgroup_version(), Some(version));
    e.start(
        &assignment("limited", "cat /proc/self/cgroup; sleep 300"),
        None,
    )
    .await
    .unwrap();
    wait_for(&e, "limited", ObservedState::Running).await;
    let read = |p: &str| std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(p)).unwrap();
    // Two GPUs: twice the per-GPU CPUs and memory.
    let gib = (1024u64 * 1024 * 1024).to_string();
    let dirs = if version == 2 {
        assert_eq!(read("gpurent-test/limited/cpu.max").trim(), "400000 100000");
        assert_eq!(read("gpurent-test/limited/memory.max").trim(), gib);
        assert_eq!(read("gpurent-test/limited/pids.max").trim(), "64");
        vec![root.join("limited")]
    } else {
        assert_eq!(
            read("cpu/gpurent-test/limited/cpu.cfs_quota_us").trim(),
            "400000"
        );
        assert_eq!(
            read("cpu/gpurent-test/limited/cpu.cfs_period_us").trim(),
            "100000"
        );
        assert_eq!(
            read("memory/gpurent-test/limited/memory.limit_in_bytes").trim(),
            gib
        );
        assert_eq!(read("pids/gpurent-test/limited/pids.max").trim(), "64");
        ["cpu", "memory", "pids"]
            .map(|c| {
                Path::new("/sys/fs/cgroup")
                    .join(c)
                    .join("gpurent-test/limited")
            })
            .to_vec()
    };
    let mut output = String::new();
    for _ in 0..250 {
        output = std::fs::read_to_string(e.output_path("limited")).unwrap_or_default();
        if output.contains("/gpurent-test/limited") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(output.contains("/gpurent-test/limited"), "{output}");
    // GPU processes are found by their cgroup.
    let pid = e
        .list()
        .await
        .map(|_| std::fs::read_to_string(dirs[dirs.len() - 1].join("cgroup.procs")).unwrap())
        .unwrap();
    let pid: u32 = pid.lines().last().unwrap().trim().parse().unwrap();
    assert_eq!(e.owner_of(pid).await.as_deref(), Some("limited"));
    e.stop("limited", None).await.unwrap();
    for dir in dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
