//! A host that cannot isolate tenants' processes: `gpurent agent` refuses the process
//! executor there, saying why and what to do; allowed with `--allow-unisolated`, the node and
//! the offers say `unisolated`.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{Cluster, BIN};

/// Kills the agent if the test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_agent_that_cannot_isolate_refuses_the_process_executor() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let child = Command::new(BIN)
        .args(["--server", "http://127.0.0.1:9", "agent", "--data-dir"])
        .arg(dir.path().join("node"))
        .args([
            "--name",
            "bare",
            "--sim-gpus",
            "1xRTX4090",
            "--executor",
            "process",
        ])
        // No cgroup tree there: isolation cannot be set up, whoever runs the test.
        .args([
            "--cgroup-root",
            "/nonexistent/gpurent",
            "--join-token",
            "gpj_x",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut agent = KillOnDrop(child);
    let mut status = None;
    for _ in 0..300 {
        status = agent.0.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the agent did not refuse within 15 s: {status:?}\n{stderr}"
    );
    assert!(
        stderr.contains("cannot isolate instances on this host")
            && stderr.contains("/nonexistent/gpurent")
            && stderr.contains("--allow-unisolated"),
        "{stderr}"
    );
}

#[test]
fn an_unisolated_node_says_so_in_nodes_ls_and_offers() {
    let cluster = Cluster::start("127.0.0.1:0");
    // agent_args: the process executor with --allow-unisolated and no cgroup tree.
    let args = cluster.agent_args("bare", &[]);
    let _agent = cluster.agent("bare", &args);
    cluster.wait_ready(1);
    let nodes = cluster.cli(Some(&cluster.admin), false, &["nodes", "ls"]);
    assert_eq!(nodes.code, 0, "{nodes:?}");
    assert!(
        nodes.stdout.contains("process (unisolated)/sim"),
        "{}",
        nodes.stdout
    );
    let offers = cluster.cli(Some(&cluster.admin), false, &["offers"]);
    assert_eq!(offers.code, 0, "{offers:?}");
    assert!(
        offers.stdout.contains("1 (1 unisolated)"),
        "{}",
        offers.stdout
    );
    let json = cluster.cli(Some(&cluster.admin), true, &["offers"]).json();
    assert_eq!(json[0]["unisolated"], 1, "{json}");
}
