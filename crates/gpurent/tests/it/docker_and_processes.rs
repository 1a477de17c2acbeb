//! The first run on a node with a Docker Engine: an agent with no executor flag runs a
//! reservation without an image (`-- echo hi`, the README's first try) as an isolated process
//! and one with `--image` as a container, says so at start and in `nodes ls`.

use crate::host_limits::{docker, engine_answers, Containers};
use crate::support::{eventually, Cluster, Daemon};

/// `/proc/self` belongs to the process's effective user.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// An agent with no executor flag (`auto`) on two simulated GPUs, named `prefix` and this
/// process's id (the Docker scope is the node's name: apart from other tests' agents), once
/// ready; with its containers' cleanup and what it said at start.
pub(crate) fn agent(
    cluster: &Cluster,
    prefix: &str,
    extra: &[&str],
) -> (Daemon, Containers, String) {
    let name = format!("{prefix}-{}", std::process::id());
    let containers = Containers(name.clone());
    let join = cluster
        .cli(Some(&cluster.admin), true, &["nodes", "join-token"])
        .json();
    let data = cluster.dir.path().join(&name);
    let log = cluster.dir.path().join(format!("{name}.log"));
    let args = [
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
    ];
    let daemon = Daemon::start_quiet(&[&args[..], extra].concat(), &log);
    cluster.wait_ready(1);
    (daemon, containers, std::fs::read_to_string(&log).unwrap())
}

/// Whether a Docker Engine answers and processes can be isolated here (root): else the test
/// says it is skipped.
pub(crate) fn docker_and_isolation() -> bool {
    if !engine_answers() {
        eprintln!("SKIPPED: no Docker Engine here (GPURENT_TEST_DOCKER=0 skips); scripts/test.sh starts one");
        return false;
    }
    if !running_as_root() || std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") {
        eprintln!(
            "SKIPPED: the isolated process executor needs root (GPURENT_TEST_ISOLATION=0 skips)"
        );
        return false;
    }
    true
}

#[test]
fn auto_with_docker_runs_echo_hi_as_a_process_and_an_image_as_a_container() {
    if !docker_and_isolation() {
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, started) = agent(&cluster, "both", &[]);
    assert!(
        started.contains("a Docker Engine answers on")
            && started.contains(
                "instances with an image run as containers, others as isolated processes"
            ),
        "the agent must say which executor it picked:\n{started}"
    );
    let node = &cluster.nodes()[0];
    assert_eq!(node["executor"], "docker+process", "{node}");
    assert_eq!(node["isolated"], true, "{node}");
    let table = cluster.cli(Some(&cluster.admin), false, &["nodes", "ls"]);
    assert!(
        table.stdout.contains("docker+process/sim"),
        "{}",
        table.stdout
    );

    let token = cluster.tenant("nina");
    let reserve = |args: &[&str]| {
        cluster.reserve(
            &token,
            &[&["--gpu", "rtx4090", "--hours", "1"], args].concat(),
        )
    };
    let containers_of = |id: &str| {
        docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=io.gpurent.reservation={id}"),
        ])
    };

    let hi = reserve(&["--", "echo", "hi"]);
    let mut last = serde_json::Value::Null;
    eventually("echo hi to end", 60, || {
        last = cluster.get(&token, &hi);
        matches!(last["status"].as_str(), Some("stopped" | "failed"))
    });
    let logs = cluster.cli(Some(&token), false, &["logs", &hi]);
    assert_eq!(last["status"], "stopped", "{last}\nlog: {}", logs.stdout);
    assert_eq!(last["end_reason"], "exited", "{last}");
    assert!(logs.stdout.lines().any(|l| l == "hi"), "{logs:?}");
    assert_eq!(containers_of(&hi), "", "echo hi ran in a container");

    let boxed = reserve(&[
        "--image",
        "gpurent-test/busybox",
        "--",
        "sh",
        "-c",
        "echo box; sleep 300",
    ]);
    eventually("the container's output", 60, || {
        let logs = cluster.cli(Some(&token), false, &["logs", &boxed]);
        logs.stdout.lines().any(|l| l == "box")
    });
    assert_eq!(cluster.get(&token, &boxed)["status"], "running");
    assert_ne!(containers_of(&boxed), "", "no container for {boxed}");
    assert_eq!(containers_of(&hi), "", "echo hi ran in a container");
    let stop = cluster.cli(Some(&token), true, &["stop", &boxed]);
    assert_eq!(stop.code, 0, "{stop:?}");
    eventually("the container to stop", 60, || {
        cluster.get(&token, &boxed)["status"] == "stopped"
    });
    let logs = cluster.cli(Some(&token), false, &["logs", &boxed]);
    assert!(logs.stdout.lines().any(|l| l == "box"), "{logs:?}");
    cluster.ledger_check();
}

/// Where processes cannot be isolated (here: no cgroup tree at `--cgroup-root`), `auto` keeps
/// Docker alone, never unisolated processes: a reservation without an image fails saying it
/// needs one. With `--allow-unisolated` they run unisolated, and the node says so.
#[test]
fn auto_with_docker_never_falls_back_to_unisolated_processes_unasked() {
    if !engine_answers() {
        eprintln!("SKIPPED: no Docker Engine here (GPURENT_TEST_DOCKER=0 skips); scripts/test.sh starts one");
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let no_cgroups = ["--cgroup-root", "/nonexistent/gpurent"];
    let (agent_alone, _containers, started) = agent(&cluster, "alone", &no_cgroups);
    assert!(
        started.contains("running instances as containers (instances without an image cannot run:")
            && started.contains("/nonexistent/gpurent"),
        "{started}"
    );
    let node = &cluster.nodes()[0];
    assert_eq!(node["executor"], "docker", "{node}");
    assert_eq!(node["isolated"], true, "{node}");
    let token = cluster.tenant("omar");
    let hi = cluster.reserve(
        &token,
        &["--gpu", "rtx4090", "--hours", "1", "--", "echo", "hi"],
    );
    let mut last = serde_json::Value::Null;
    eventually("echo hi to fail", 60, || {
        last = cluster.get(&token, &hi);
        matches!(last["status"].as_str(), Some("stopped" | "failed"))
    });
    assert_eq!(last["status"], "failed", "{last}");
    assert_eq!(last["end_reason"], "failed_to_start", "{last}");
    assert!(
        last["end_message"]
            .as_str()
            .is_some_and(|m| m.contains("needs an image (--image)")),
        "{last}"
    );
    drop(agent_alone);

    let cluster = Cluster::start("127.0.0.1:0");
    let allowed = [&no_cgroups[..], &["--allow-unisolated"]].concat();
    let (_agent, _containers, started) = agent(&cluster, "allowed", &allowed);
    assert!(
        started
            .contains("instances with an image run as containers, others as UNISOLATED processes"),
        "{started}"
    );
    let node = &cluster.nodes()[0];
    assert_eq!(node["executor"], "docker+process", "{node}");
    assert_eq!(node["isolated"], false, "{node}");
}
