//! Issue 17 with a Docker Engine: an agent on simulated GPUs with no executor flag runs
//! containers (never the sim executor), each with its GPU's share of the host's cores even with
//! the default `--cpus-per-gpu 4` on a 2-core host (Docker refuses more CPUs than the host has:
//! every start used to fail), and a start Docker refuses ends `failed_to_start` saying why.

use crate::support::{eventually, Cluster, Daemon};

pub(crate) fn docker(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub(crate) fn engine_answers() -> bool {
    if std::env::var("GPURENT_TEST_DOCKER").as_deref() == Ok("0") {
        return false;
    }
    let up = std::process::Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        up || std::env::var("GPURENT_TEST_DOCKER").as_deref() != Ok("1"),
        "GPURENT_TEST_DOCKER=1 but no Docker Engine answers"
    );
    up
}

/// Removes the containers of an agent's scope (its node name), even when the test fails: a
/// killed agent leaves them running.
pub(crate) struct Containers(pub(crate) String);

impl Drop for Containers {
    fn drop(&mut self) {
        let filter = format!("label=io.gpurent.scope={}", self.0);
        for id in docker(&["ps", "-aq", "--filter", &filter]).lines() {
            docker(&["rm", "-f", id]);
        }
    }
}

#[test]
fn containers_on_a_small_host_get_their_share_of_its_cores() {
    if !engine_answers() {
        eprintln!("SKIPPED: no Docker Engine here (GPURENT_TEST_DOCKER=0 skips); scripts/test.sh starts one");
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let name = format!("limits-{}", std::process::id());
    let _containers = Containers(name.clone());
    let join = cluster
        .cli(Some(&cluster.admin), true, &["nodes", "join-token"])
        .json();
    let data = cluster.dir.path().join(&name);
    let log = cluster.dir.path().join("agent.log");
    // Defaults: --executor auto, --cpus-per-gpu 4, --memory-per-gpu-gb 16.
    let _agent = Daemon::start_quiet(
        &[
            "--server",
            &cluster.url,
            "agent",
            "--data-dir",
            data.to_str().unwrap(),
            "--name",
            &name,
            "--sim-gpus",
            "2xRTX4090",
            "--join-token",
            join["token"].as_str().unwrap(),
        ],
        &log,
    );
    cluster.wait_ready(1);
    // A node is ready once registered; its host facts come with its first sync after that.
    eventually("the node's host facts", 30, || {
        !cluster.nodes()[0]["cpus"].is_null()
    });
    let node = &cluster.nodes()[0];
    // Containers for reservations with an image; where this host can isolate processes too,
    // those without one run as processes (`docker_and_processes`).
    assert!(
        matches!(node["executor"].as_str(), Some("docker" | "docker+process")),
        "{node}"
    );
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(node["cpus"], cores, "{node}");
    let started = std::fs::read_to_string(&log).unwrap();
    assert!(
        started.contains("a Docker Engine answers on") && started.contains("as containers"),
        "{started}"
    );

    let token = cluster.tenant("tess");
    let id = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--image",
            "gpurent-test/busybox:latest",
            "--",
            "sh",
            "-c",
            "echo cpus=$GPURENT_CPUS; sleep 300",
        ],
    );
    let mut last = serde_json::Value::Null;
    eventually("the container to run", 60, || {
        last = cluster.get(&token, &id);
        last["status"] != "pending"
    });
    assert_eq!(last["status"], "running", "{last}");
    let filter = format!("label=io.gpurent.reservation={id}");
    let container = docker(&["ps", "-q", "--filter", &filter]);
    assert!(!container.is_empty(), "no running container for {id}");
    let nano: u64 = docker(&["inspect", "-f", "{{.HostConfig.NanoCpus}}", &container])
        .parse()
        .unwrap();
    // One GPU of two: half the host's cores, at most the 4 CPUs a GPU brings.
    let milli = (u64::try_from(cores).unwrap() * 1000 / 2).min(4000);
    assert_eq!(nano, milli * 1_000_000, "NanoCpus of {container}");
    assert!(nano <= u64::try_from(cores).unwrap() * 1_000_000_000);
    // Whole cores or a half (cores / 2).
    let cpus = if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{}.5", milli / 1000)
    };
    eventually("the instance's output", 30, || {
        let logs = cluster.cli(Some(&token), false, &["logs", &id]);
        logs.stdout.lines().any(|l| l == format!("cpus={cpus}"))
    });

    // An image the node does not have: the tenant is told, in get and in the log.
    let bad = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--image",
            "gpurent-test/no-such-image:never",
            "--",
            "true",
        ],
    );
    eventually("the failed start to end", 60, || {
        last = cluster.get(&token, &bad);
        last["status"] == "failed"
    });
    assert_eq!(last["end_reason"], "failed_to_start", "{last}");
    let message = last["end_message"].as_str().unwrap_or_default().to_owned();
    assert!(
        // The node lacks it and tried to pull it: no registry has it (none is reachable).
        message.contains("cannot pull image gpurent-test/no-such-image:never"),
        "{last}"
    );
    let logs = cluster.cli(Some(&token), false, &["logs", &bad]);
    assert!(
        logs.stdout
            .contains(&format!("[gpurent] failed_to_start: {message}")),
        "{logs:?}"
    );
    let human = cluster.cli(Some(&token), false, &["get", &bad]);
    assert!(
        human
            .stdout
            .contains(&format!("failed_to_start: {message}")),
        "{human:?}"
    );

    let stop = cluster.cli(Some(&token), true, &["stop", &id]);
    assert_eq!(stop.code, 0, "{stop:?}");
    eventually("stopped", 60, || {
        cluster.get(&token, &id)["status"] == "stopped"
    });
    cluster.ledger_check();
}
