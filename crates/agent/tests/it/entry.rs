//! Getting into running instances (`Executor::enter`) of the isolated process executor:
//! exec with exit codes and signals, a PTY shell driven line by line (size, resize, ^C), stdin
//! streamed both ways, the instance's environment, user and cgroup, a TCP connection to a
//! server inside, an unisolated instance, and the refusals (sim, an unknown reservation). The
//! Docker executor's are `entry_docker`, what they share `entry_support`.

use std::path::Path;
use std::time::Duration;

use gpurent_agent::executor::{ProcessExecutor, ResourcesPerGpu, SimExecutor};
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::{EntryRequest, Executor, ExitStatus};

use crate::entry_support::{
    assignment, docker_executor, enter, exec, exit_statuses, free_port, pid_of, process_executor,
    pty_shell, read_until, run_to_end, sh, start_process, stdin_streamed, tcp_to_httpd, unique,
    PATIENCE,
};
use crate::support::wait_for;

#[tokio::test]
async fn entry_process_exec_statuses_pty_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = process_executor(dir.path(), 331_000) else {
        return;
    };
    let id = unique("enter-proc");
    let (uid, _guard) = start_process(&e, &id, "exec sleep 300").await;
    exit_statuses(
        &*e,
        &id,
        ExitStatus::Signal {
            name: "TERM".into(),
            core_dumped: false,
        },
    )
    .await;
    pty_shell(&*e, &id, "stty", "sleep 7301", Some(uid)).await;
    stdin_streamed(&*e, &id).await;
}

#[tokio::test]
async fn entry_process_session_has_the_instance_environment_user_and_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = process_executor(dir.path(), 332_000) else {
        return;
    };
    let id = unique("enter-env");
    let (uid, _guard) = start_process(&e, &id, "exec sleep 300").await;
    let request = EntryRequest {
        env: vec![
            ("LANG".into(), "C.UTF-8".into()),
            ("CUDA_VISIBLE_DEVICES".into(), "all".into()),
            ("MODEL".into(), "not-mine".into()),
        ],
        ..exec(concat!(
            "echo \"cuda=$CUDA_VISIBLE_DEVICES model=$MODEL token=$HF_TOKEN lang=$LANG ",
            "home=$HOME pwd=$(pwd) id=$GPURENT_RESERVATION_ID\"; id -u; id -G; ",
            "cat /proc/self/cgroup; grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status"
        ))
    };
    let (out, err, status) = run_to_end(enter(&*e, &id, request).await).await;
    assert_eq!(status, ExitStatus::Code(0), "{out}{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some(format!(
            "cuda=GPU-aaaa,GPU-bbbb model=llama token=s3cret lang=C.UTF-8 home=/instance pwd=/instance id={id}"
        ).as_str()),
        "{out}"
    );
    assert_eq!(
        lines.next(),
        Some(uid.to_string().as_str()),
        "the instance's uid: {out}"
    );
    assert_eq!(
        lines.next(),
        Some(uid.to_string().as_str()),
        "its group only: {out}"
    );
    assert!(uid >= 332_000, "{uid}");
    assert!(
        out.contains(&format!("pids:/gpurent-test/{id}"))
            || out.contains(&format!("::/gpurent-test/{id}")),
        "the session is in the instance's cgroup: {out}"
    );
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    // The instance's PID namespace: the node's processes are not there.
    let (ps, _, _) = run_to_end(enter(&*e, &id, exec("ls /proc | grep -c '^[0-9]'")).await).await;
    let seen: u32 = ps.trim().parse().unwrap();
    assert!(
        seen < 10,
        "the session sees {seen} processes: not the instance's PID namespace"
    );
    // Nothing waits in between: the session's process is the agent's child, and a session
    // given up is killed and reaped.
    let mut s = enter(&*e, &id, exec("echo started; exec sleep 7303")).await;
    let mut seen = String::new();
    read_until(&mut *s.stdout, &mut seen, "started").await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let pid = loop {
        // `started` comes before the exec of sleep.
        if let Some(pid) = pid_of("sleep 7303") {
            break pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session's sleep never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let ppid: u32 = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        ppid,
        std::process::id(),
        "the session's parent is the agent"
    );
    drop(s);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a dropped session's process stayed (or was never reaped)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn entry_process_tcp_reaches_a_server_in_the_instance() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = process_executor(dir.path(), 333_000) else {
        return;
    };
    let id = unique("enter-tcp");
    let port = free_port();
    let (_uid, _guard) = start_process(
        &e,
        &id,
        &format!("echo hello-from-the-instance > index.html; exec busybox httpd -f -p 127.0.0.1:{port} -h /instance"),
    )
    .await;
    tcp_to_httpd(&*e, &id, port).await;
}

#[tokio::test]
async fn entry_is_refused_for_sim_and_unknown_reservations() {
    let sim = SimExecutor::new();
    sim.start(&assignment("sim-r", None, vec![]), None)
        .await
        .unwrap();
    let refused = sim
        .enter("sim-r", exec("true"))
        .await
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        refused.as_deref(),
        Some("the sim executor runs nothing: there is no instance to enter")
    );
    let dir = tempfile::tempdir().unwrap();
    let process =
        ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default()).unwrap();
    let refused = process
        .enter("nope", exec("true"))
        .await
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        refused.as_deref(),
        Some("reservation nope is not running on this node")
    );
    if let Some(docker) = docker_executor().await {
        let refused = docker
            .enter("nope", exec("true"))
            .await
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some("reservation nope is not running on this node")
        );
    }
}

#[tokio::test]
async fn entry_unisolated_process_session_runs_in_the_instance_directory() {
    let dir = tempfile::tempdir().unwrap();
    let e = ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default()).unwrap();
    let id = unique("enter-unisolated");
    e.start(&assignment(&id, None, sh("exec sleep 300")), None)
        .await
        .unwrap();
    wait_for(&e, &id, ObservedState::Running).await;
    let (out, _, status) =
        run_to_end(enter(&e, &id, exec("echo \"$MODEL $CUDA_VISIBLE_DEVICES\"; pwd")).await).await;
    e.stop(&id, Some(Duration::ZERO)).await.unwrap();
    assert_eq!(status, ExitStatus::Code(0));
    let home = e.home_path(&id);
    assert_eq!(
        out,
        format!("llama GPU-aaaa,GPU-bbbb\n{}\n", home.display())
    );
}
