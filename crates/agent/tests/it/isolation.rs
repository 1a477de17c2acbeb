//! The process executor against a hostile tenant: the agent's data dir, another instance and
//! another tenant's environment out of reach, nothing outliving a stop, the pids limit, the
//! reserved variables, a tenant `PATH`. Isolation needs root and bubblewrap: elsewhere these
//! tests say why they did not run (the refusal test runs everywhere).

use std::path::Path;
use std::time::Duration;

use gpurent_agent::executor::{Isolation, ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::{AgentError, Executor};
use gpurent_types::agent::Assignment;

use crate::support::{state_of, wait_for};

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The tests' cgroup root: v2, or its name under the v1 hierarchies where only v1 exists.
const CGROUP_ROOT: &str = "/sys/fs/cgroup/gpurent-test";

fn assignment(id: &str, script: &str) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch: 1,
        restart_count: 0,
        array_index: None,
        gpus: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
        vram_mb: None,
        image: None,
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

/// An isolating executor over `data_dir`, its uids from `uid_base` (each test its own, as
/// tests run at once); None, with the reason printed, where this host cannot isolate.
fn isolated(data_dir: &Path, uid_base: u32, resources: ResourcesPerGpu) -> Option<ProcessExecutor> {
    let isolation = Isolation {
        cgroup_root: CGROUP_ROOT.into(),
        uid_base,
        allow_unisolated: false,
        hidden: vec![],
    };
    match ProcessExecutor::isolated(data_dir, &isolation, resources) {
        Ok(e) => Some(e.with_grace(Duration::from_secs(2))),
        Err(e) => skip_unless_root(&e),
    }
}

/// Not root (or GPURENT_TEST_ISOLATION=0, for a root without namespaces): None, saying why.
/// As root, isolation must work (`scripts/test.sh` installs bubblewrap).
fn skip_unless_root<T>(why: &AgentError) -> Option<T> {
    if !running_as_root() {
        eprintln!("SKIPPED: not root, so no isolation to test: {why}");
        return None;
    }
    if std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") {
        eprintln!("SKIPPED: GPURENT_TEST_ISOLATION=0: {why}");
        return None;
    }
    panic!("root, yet no isolation (install bubblewrap; GPURENT_TEST_ISOLATION=0 skips): {why}")
}

/// The instance's output once it holds `want` (or after 10 s, whatever it holds then).
async fn output_with(e: &ProcessExecutor, id: &str, want: &str) -> String {
    let mut output = String::new();
    for _ in 0..500 {
        output = std::fs::read_to_string(e.output_path(id)).unwrap_or_default();
        if output.contains(want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    output
}

/// Processes of the node whose command line begins with `needle` (not zombies).
fn processes_with(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            !zombie
                && String::from_utf8_lossy(&cmdline)
                    .replace('\0', " ")
                    .starts_with(needle)
        })
        .collect()
}

/// Kills what a failed test leaves behind: every process whose command line begins with
/// the needle.
struct KillOnDrop(&'static str);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in processes_with(self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The repro: `cat ../../../admin.token ../../../master.key ../../node.json` printed the
/// admin token, the master key and the node credential into the tenant's log.
#[tokio::test]
async fn a_tenant_cannot_read_the_agent_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = data.join("agent");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(data.join("admin.token"), "gpa_ADMINSECRET").unwrap();
    std::fs::write(data.join("master.key"), "MASTERKEYSECRET").unwrap();
    std::fs::write(
        agent.join("node.json"),
        r#"{"node_token":"gpn_NODESECRET"}"#,
    )
    .unwrap();
    let Some(e) = isolated(&agent, 301_000, ResourcesPerGpu::default()) else {
        return;
    };
    let mut a = assignment(
        "reader",
        r#"cat ../../../admin.token ../../../master.key ../../node.json ../../../../data/admin.token "$D/admin.token" "$D/master.key" "$D/agent/node.json"; echo done"#,
    );
    a.env
        .insert("D".into(), data.to_string_lossy().into_owned());
    e.start(&a, None).await.unwrap();
    wait_for(&e, "reader", ObservedState::Exited(0)).await;
    let output = output_with(&e, "reader", "done").await;
    assert!(output.contains("done"), "{output}");
    for secret in ["ADMINSECRET", "MASTERKEYSECRET", "NODESECRET"] {
        assert!(
            !output.contains(secret),
            "the tenant read {secret}: {output}"
        );
    }
    e.stop("reader", None).await.unwrap();
}

/// A data dir under a system directory the sandbox shows read-only (`/opt` here; `/etc`
/// alike), and the control plane's data dir around it (`up`), are covered, not shown.
#[tokio::test]
async fn a_data_dir_under_a_system_directory_stays_hidden() {
    let Ok(dir) = tempfile::tempdir_in("/opt") else {
        eprintln!("SKIPPED: cannot make a directory in /opt here");
        return;
    };
    let data = dir.path().join("data");
    let agent = data.join("agent");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(data.join("admin.token"), "gpa_ADMINSECRET").unwrap();
    std::fs::write(
        agent.join("node.json"),
        r#"{"node_token":"gpn_NODESECRET"}"#,
    )
    .unwrap();
    let isolation = Isolation {
        cgroup_root: CGROUP_ROOT.into(),
        uid_base: 310_000,
        allow_unisolated: false,
        hidden: vec![data.clone()],
    };
    let e = match ProcessExecutor::isolated(&agent, &isolation, ResourcesPerGpu::default()) {
        Ok(e) => e,
        Err(e) => return skip_unless_root(&e).unwrap_or(()),
    };
    let mut a = assignment(
        "peeker",
        r#"cat "$D/admin.token" "$D/agent/node.json"; ls -R "$D"; echo done"#,
    );
    a.env
        .insert("D".into(), data.to_string_lossy().into_owned());
    e.start(&a, None).await.unwrap();
    wait_for(&e, "peeker", ObservedState::Exited(0)).await;
    let output = output_with(&e, "peeker", "done").await;
    e.stop("peeker", None).await.unwrap();
    assert!(output.contains("done"), "{output}");
    for secret in ["ADMINSECRET", "NODESECRET", "instances"] {
        assert!(
            !output.contains(secret),
            "the tenant saw {secret}: {output}"
        );
    }
}

/// The repros: another tenant's secrets read from `/proc/PID/environ`, and
/// `echo X >> ../<other-id>/output.log` written into another tenant's log.
#[tokio::test]
async fn a_tenant_cannot_reach_another_instance() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = KillOnDrop("sleep 30201");
    let Some(e) = isolated(dir.path(), 302_000, ResourcesPerGpu::default()) else {
        return;
    };
    let mut victim = assignment("victim", "echo victim-up; sleep 30201");
    victim
        .secrets
        .0
        .insert("API_KEY".into(), "VICTIMSECRET".into());
    e.start(&victim, None).await.unwrap();
    assert!(output_with(&e, "victim", "victim-up")
        .await
        .contains("victim-up"));
    let mut attacker = assignment(
        "attacker",
        r#"for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f"; done 2>/dev/null | grep API_KEY
cat ../victim/output.log "$VICTIM_LOG" 2>/dev/null
echo TAMPERED >> ../victim/output.log; echo TAMPERED >> "$VICTIM_LOG"
ls -d /proc/[0-9]* | wc -l | sed 's/^/processes=/'
echo done"#,
    );
    attacker.env.insert(
        "VICTIM_LOG".into(),
        e.output_path("victim").to_string_lossy().into_owned(),
    );
    e.start(&attacker, None).await.unwrap();
    wait_for(&e, "attacker", ObservedState::Exited(0)).await;
    let output = output_with(&e, "attacker", "done").await;
    assert!(output.contains("done"), "{output}");
    assert!(
        !output.contains("VICTIMSECRET"),
        "the attacker read the victim's environment: {output}"
    );
    assert!(
        !output.contains("victim-up"),
        "the attacker read the victim's output: {output}"
    );
    let victim_log = std::fs::read_to_string(e.output_path("victim")).unwrap();
    assert_eq!(
        victim_log, "victim-up\n",
        "the attacker wrote into the victim's log"
    );
    // Its own PID namespace: its init, its shell and what the shell runs, nothing of the node.
    let processes: u32 = output
        .lines()
        .find_map(|l| l.strip_prefix("processes="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(u32::MAX);
    assert!(
        processes < 10,
        "the attacker sees {processes} processes: {output}"
    );
    e.stop("attacker", None).await.unwrap();
    e.stop("victim", None).await.unwrap();
}

/// The repro: `setsid sh -c 'sleep 30; ...' &` kept running after stop, unbilled.
#[tokio::test]
async fn a_setsid_escape_dies_at_stop() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = (KillOnDrop("sleep 31337"), KillOnDrop("sleep 31338"));
    let Some(e) = isolated(dir.path(), 303_000, ResourcesPerGpu::default()) else {
        return;
    };
    e.start(
        &assignment(
            "escape",
            "setsid sh -c 'sleep 31337' > /dev/null 2>&1 < /dev/null & echo escaped; sleep 31338",
        ),
        None,
    )
    .await
    .unwrap();
    wait_for(&e, "escape", ObservedState::Running).await;
    for _ in 0..250 {
        if !processes_with("sleep 31337").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !processes_with("sleep 31337").is_empty(),
        "the escape never ran"
    );
    e.stop("escape", None).await.unwrap();
    let mut left = processes_with("sleep 31337");
    for _ in 0..100 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = processes_with("sleep 31337");
    }
    assert!(
        left.is_empty(),
        "the setsid escape survived the stop: {left:?}"
    );
}

/// The repro: 1,500 processes started unrefused on cgroup v1. With a pids limit of 64, a
/// loop that starts 500 is refused well before its end.
#[tokio::test]
async fn a_fork_loop_meets_the_pids_limit() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = KillOnDrop("sleep 27182");
    let resources = ResourcesPerGpu {
        pids: 64,
        ..ResourcesPerGpu::default()
    };
    let Some(e) = isolated(dir.path(), 304_000, resources) else {
        return;
    };
    e.start(
        &assignment(
            "forker",
            "i=0; while [ $i -lt 500 ]; do sleep 27182 & i=$((i + 1)); echo started=$i; done; echo all-started; wait",
        ),
        None,
    )
    .await
    .unwrap();
    // It ends once a fork fails (the shell gives up), or starts all 500 (no limit).
    for _ in 0..500 {
        let output = std::fs::read_to_string(e.output_path("forker")).unwrap_or_default();
        if output.contains("all-started")
            || matches!(state_of(&e, "forker").await, Some(ObservedState::Exited(_)))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let output = std::fs::read_to_string(e.output_path("forker")).unwrap_or_default();
    let started = output
        .lines()
        .filter_map(|l| l.strip_prefix("started="))
        .filter_map(|n| n.trim().parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    e.stop("forker", None).await.unwrap();
    eprintln!("the fork loop started {started} of 500 processes under a pids limit of 64");
    assert!(
        !output.contains("all-started") && started <= 64,
        "{started} processes started against a pids limit of 64"
    );
    assert!(processes_with("sleep 27182").is_empty());
}

/// The repro: a tenant's env overrode `CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`,
/// `GPURENT_*` and `HOME`.
#[tokio::test]
async fn reserved_variables_cannot_be_overridden() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = isolated(dir.path(), 305_000, ResourcesPerGpu::default()) else {
        return;
    };
    let mut a = assignment(
        "reserved",
        "echo cuda=$CUDA_VISIBLE_DEVICES nvidia=$NVIDIA_VISIBLE_DEVICES id=$GPURENT_RESERVATION_ID x=${GPURENT_X:-unset} caps=${NVIDIA_DRIVER_CAPABILITIES:-unset} home=$HOME",
    );
    for (k, v) in [
        ("CUDA_VISIBLE_DEVICES", "all"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("NVIDIA_DRIVER_CAPABILITIES", "all"),
        ("GPURENT_RESERVATION_ID", "someone-else"),
        ("GPURENT_X", "1"),
        ("HOME", "/root"),
    ] {
        a.env.insert(k.into(), v.into());
    }
    e.start(&a, None).await.unwrap();
    wait_for(&e, "reserved", ObservedState::Exited(0)).await;
    let output = output_with(&e, "reserved", "home=").await;
    assert_eq!(
        output.trim(),
        "cuda=GPU-aaaa,GPU-bbbb nvidia=GPU-aaaa,GPU-bbbb id=reserved x=unset caps=unset home=/instance"
    );
    e.stop("reserved", None).await.unwrap();
}

/// The repro: a tenant `PATH` broke the wrapper (`mv: not found`) and the exit code was lost.
#[tokio::test]
async fn a_tenant_path_does_not_lose_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = isolated(dir.path(), 306_000, ResourcesPerGpu::default()) else {
        return;
    };
    let mut a = assignment("path", "exit 7");
    a.env.insert("PATH".into(), "/nonexistent".into());
    e.start(&a, None).await.unwrap();
    wait_for(&e, "path", ObservedState::Exited(7)).await;
    e.stop("path", None).await.unwrap();
    // Unisolated too (the wrapper then runs with the tenant's environment).
    let dir = tempfile::tempdir().unwrap();
    let e = ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default()).unwrap();
    e.start(&a, None).await.unwrap();
    wait_for(&e, "path", ObservedState::Exited(7)).await;
    e.stop("path", None).await.unwrap();
}

/// A host that cannot isolate (here: no cgroup tree where the flag says) refuses the process
/// executor, saying why and what to do, unless its owner allows unisolated instances.
#[tokio::test]
async fn a_host_that_cannot_isolate_refuses_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut isolation = Isolation {
        cgroup_root: "/nonexistent/gpurent".into(),
        uid_base: 307_000,
        allow_unisolated: false,
        hidden: vec![],
    };
    let refused = ProcessExecutor::isolated(dir.path(), &isolation, ResourcesPerGpu::default());
    let Err(err @ AgentError::Unisolated { .. }) = refused else {
        panic!("a host without a cgroup tree ran the process executor: {refused:?}");
    };
    let message = err.to_string();
    assert!(message.contains("/nonexistent"), "{message}");
    assert!(message.contains("--allow-unisolated"), "{message}");
    isolation.allow_unisolated = true;
    let e = ProcessExecutor::isolated(dir.path(), &isolation, ResourcesPerGpu::default()).unwrap();
    assert!(!e.isolated());
    assert_eq!(e.name(), "process");
}

/// In the sandbox as outside: a stop gives the workload SIGTERM and its grace period, then
/// SIGKILL; an agent restarted meanwhile adopts the instance; its processes are attributed to
/// it by their cgroup (GPU telemetry).
#[tokio::test]
async fn an_isolated_instance_is_adopted_attributed_and_stopped_after_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let volume = tempfile::tempdir().unwrap();
    let _cleanup = KillOnDrop("sleep 16180");
    let Some(first) = isolated(dir.path(), 308_000, ResourcesPerGpu::default()) else {
        return;
    };
    let a = assignment(
        "graceful",
        r#"trap 'echo got-term > "$GPURENT_CHECKPOINT_DIR/got-term"' TERM; sleep 16180 & echo up; while true; do sleep 0.1; done"#,
    );
    first.start(&a, Some(volume.path())).await.unwrap();
    assert!(output_with(&first, "graceful", "up").await.contains("up"));
    // The agent dies (its executor is dropped without stopping anything) and a new one
    // starts over the same data dir.
    drop(first);
    let second = isolated(dir.path(), 308_000, ResourcesPerGpu::default()).unwrap();
    assert_eq!(
        state_of(&second, "graceful").await,
        Some(ObservedState::Running)
    );
    let sleeper = processes_with("sleep 16180");
    assert_eq!(sleeper.len(), 1, "{sleeper:?}");
    let pid = u32::try_from(sleeper[0]).unwrap();
    assert_eq!(second.owner_of(pid).await.as_deref(), Some("graceful"));
    let began = std::time::Instant::now();
    second
        .stop("graceful", Some(Duration::from_secs(2)))
        .await
        .unwrap();
    let took = began.elapsed();
    assert_eq!(
        std::fs::read_to_string(volume.path().join("got-term"))
            .unwrap_or_default()
            .trim(),
        "got-term",
        "the workload was not told by SIGTERM"
    );
    assert!(took >= Duration::from_millis(1500), "killed after {took:?}");
    assert!(processes_with("sleep 16180").is_empty());
    assert_eq!(state_of(&second, "graceful").await, None);
}

/// A workload that ends on SIGTERM is stopped at once, not after the grace period, and its
/// setsid escape with it.
#[tokio::test]
async fn an_isolated_instance_that_ends_on_sigterm_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = (KillOnDrop("sleep 14142"), KillOnDrop("sleep 14143"));
    let Some(e) = isolated(dir.path(), 309_000, ResourcesPerGpu::default()) else {
        return;
    };
    e.start(
        &assignment(
            "prompt",
            "setsid sh -c 'sleep 14142' > /dev/null 2>&1 < /dev/null & echo up; sleep 14143",
        ),
        None,
    )
    .await
    .unwrap();
    assert!(output_with(&e, "prompt", "up").await.contains("up"));
    let began = std::time::Instant::now();
    e.stop("prompt", Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let took = began.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "the stop waited out the grace: {took:?}"
    );
    assert!(processes_with("sleep 1414").is_empty());
}
