//! The real agent with the process executor: kill -9 it while its instances run, restart it
//! over the same data dir, and it adopts them: nothing restarted, nothing duplicated.

use std::path::Path;
use std::time::Duration;

use crate::support::{cli, eventually, read_token, Daemon};

fn marker_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Processes whose command line holds `needle`.
fn processes_with(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(needle))
        .count()
}

#[test]
fn a_killed_agent_adopts_its_running_instances() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Daemon::server(&data, &dir.path().join("server.log"));
    let url = server.url.clone();
    let admin = read_token(&data);
    let join = cli(&url, Some(&admin), true, &["nodes", "join-token"]).json();
    let agent_dir = dir.path().join("agent");
    let agent_args = |join: Option<&str>| {
        let mut args = vec![
            "--server".to_owned(),
            url.clone(),
            "agent".to_owned(),
            "--data-dir".to_owned(),
            agent_dir.to_str().unwrap().to_owned(),
            "--name".to_owned(),
            "box-1".to_owned(),
            "--sim-gpus".to_owned(),
            "2xRTX4090".to_owned(),
            "--executor".to_owned(),
            "process".to_owned(),
            // Not the machine's cgroup tree: this test is about adoption, not limits or
            // isolation.
            "--cgroup-root".to_owned(),
            "/nonexistent/gpurent".to_owned(),
            "--allow-unisolated".to_owned(),
        ];
        if let Some(join) = join {
            args.extend(["--join-token".to_owned(), join.to_owned()]);
        }
        args
    };
    let args = agent_args(join["token"].as_str());
    let mut agent = Daemon::start_quiet(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.path().join("agent1.log"),
    );
    eventually("the agent to join", 30, || {
        cli(&url, Some(&admin), true, &["nodes", "ls"]).json()[0]["status"] == "ready"
    });

    let tenant = cli(
        &url,
        Some(&admin),
        true,
        &["users", "create", "pat", "--credit", "50"],
    )
    .json();
    let token = tenant["token"].as_str().unwrap().to_owned();
    let marker = dir.path().join("started");
    let needle = format!("gpurent-adopt-{}", std::process::id());
    let env_marker = format!("MARKER={}", marker.display());
    let script = format!("echo $GPURENT_RESERVATION_ID >> \"$MARKER\"; exec sleep 300 # {needle}");
    let r = cli(
        &url,
        Some(&token),
        true,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--env",
            &env_marker,
            "--",
            "/bin/sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    eventually("running", 30, || {
        cli(&url, Some(&token), true, &["get", &id]).json()["status"] == "running"
    });
    eventually("the workload to start", 10, || marker_lines(&marker) == 1);
    assert_eq!(processes_with(&needle), 1);

    agent.kill9();
    // The workload outlives its agent.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        processes_with(&needle),
        1,
        "the workload died with its agent"
    );

    let args = agent_args(None);
    let _agent = Daemon::start_quiet(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.path().join("agent2.log"),
    );
    // Give the new agent a few heartbeats to (wrongly) start a second copy.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        cli(&url, Some(&token), true, &["get", &id]).json()["status"],
        "running"
    );
    assert_eq!(marker_lines(&marker), 1, "the instance was started again");
    assert_eq!(processes_with(&needle), 1, "the instance runs twice");
    let nodes = cli(&url, Some(&admin), true, &["nodes", "ls"]).json();
    assert_eq!(
        nodes.as_array().map(Vec::len),
        Some(1),
        "the restarted agent must resume its node: {nodes}"
    );
    assert_eq!(nodes[0]["executor"], "process");
    assert_eq!(nodes[0]["isolated"], false, "{:?}", nodes[0]);

    cli(&url, Some(&token), true, &["stop", &id]);
    eventually("stopped", 30, || {
        cli(&url, Some(&token), true, &["get", &id]).json()["status"] == "stopped"
    });
    eventually("the workload to end", 15, || processes_with(&needle) == 0);
}

fn docker(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `gpurent up` with the Docker executor: kill -9 it while a container runs, restart it, and
/// the same container (same start time) is adopted, not started again.
#[test]
fn a_killed_up_adopts_its_running_containers() {
    let engine = std::process::Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success());
    if !engine {
        assert_ne!(
            std::env::var("GPURENT_TEST_DOCKER").as_deref(),
            Ok("1"),
            "GPURENT_TEST_DOCKER=1 but no Docker Engine answers"
        );
        eprintln!("SKIPPED: no Docker Engine here; scripts/test.sh starts one");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "up",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--sim-gpus",
        "2xRTX4090",
        "--executor",
        "docker",
        "--cpus-per-gpu",
        "1",
        "--memory-per-gpu-gb",
        "1",
    ];
    let mut up = Daemon::start(&args, &dir.path().join("up1.log"));
    let admin = read_token(&data);
    let tenant = cli(
        &up.url,
        Some(&admin),
        true,
        &["users", "create", "dee", "--credit", "50"],
    )
    .json();
    let token = tenant["token"].as_str().unwrap().to_owned();
    let r = cli(
        &up.url,
        Some(&token),
        true,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--image",
            "gpurent-test/busybox:latest",
            "--",
            "sleep",
            "300",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let url = up.url.clone();
    eventually("running", 30, || {
        cli(&url, Some(&token), true, &["get", &id]).json()["status"] == "running"
    });
    let filter = format!("label=io.gpurent.reservation={id}");
    let container = docker(&["ps", "-q", "--filter", &filter]);
    assert!(!container.is_empty(), "no running container for {id}");
    let started = docker(&["inspect", "-f", "{{.State.StartedAt}}", &container]);
    let memory = docker(&[
        "inspect",
        "-f",
        "{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.CapDrop}}",
        &container,
    ]);
    assert_eq!(memory, "1073741824 1000000000 [ALL]");

    up.kill9();
    assert_eq!(
        docker(&["ps", "-q", "--filter", &filter]),
        container,
        "the container died with its agent"
    );
    // The same data dir, and the same port so the URL the tenant uses still works.
    let port = url.rsplit(':').next().unwrap().to_owned();
    let listen = format!("127.0.0.1:{port}");
    let mut args2 = args.to_vec();
    args2[4] = &listen;
    let _up = Daemon::start(&args2, &dir.path().join("up2.log"));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        cli(&url, Some(&token), true, &["get", &id]).json()["status"],
        "running"
    );
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &filter]),
        container,
        "one container, the same one"
    );
    assert_eq!(
        docker(&["inspect", "-f", "{{.State.StartedAt}}", &container]),
        started,
        "the container was restarted"
    );

    cli(&url, Some(&token), true, &["stop", &id]);
    eventually("stopped", 30, || {
        cli(&url, Some(&token), true, &["get", &id]).json()["status"] == "stopped"
    });
    eventually("the container to be removed", 15, || {
        docker(&["ps", "-aq", "--filter", &filter]).is_empty()
    });
}
