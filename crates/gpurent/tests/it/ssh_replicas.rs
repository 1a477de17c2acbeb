//! Two control-plane replicas on one PostgreSQL database, the agent connected to one of
//! them: an SSH client that reaches the other is relayed through the first to the agent, and
//! its command runs in the instance.

use std::path::Path;

use gpurent_store::testing::TestDatabase;
use gpurent_store::Backend;

use crate::ssh_endpoint::{keygen, reserve_running, ssh, tenant};
use crate::support::{cli, eventually, read_token, Daemon};

fn replica(dir: &Path, data: &Path, db: &str, name: &str) -> (Daemon, u16) {
    let daemon = Daemon::start(
        &[
            "server",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--ssh-listen",
            "127.0.0.1:0",
            "--database-url",
            db,
        ],
        &dir.join(format!("{name}.log")),
    );
    // Read at once: the replicas share the data dir (and so the SSH host key).
    let addr = std::fs::read_to_string(data.join("ssh.addr")).unwrap();
    let port = addr.trim().rsplit(':').next().unwrap().parse().unwrap();
    (daemon, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_reaches_an_agent_connected_to_another_replica() {
    let db = TestDatabase::new(Backend::Postgres).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (a, a_port) = replica(dir.path(), &data, &db.url, "a");
    let admin = read_token(&data);
    let join = cli(&a.url, Some(&admin), true, &["nodes", "join-token"]).json();
    let agent_dir = dir.path().join("agent");
    let _agent = Daemon::start_quiet(
        &[
            "--server",
            &a.url,
            "agent",
            "--join-token",
            join["token"].as_str().unwrap(),
            "--data-dir",
            agent_dir.to_str().unwrap(),
            "--name",
            "gpu-host-1",
            "--sim-gpus",
            "1xRTX4090",
            // A real instance to enter (unisolated: this test is about replicas, not limits).
            "--executor",
            "process",
            "--allow-unisolated",
            "--cgroup-root",
            "/nonexistent/gpurent",
        ],
        &dir.path().join("agent.log"),
    );
    eventually("the agent to join", 30, || {
        cli(&a.url, Some(&admin), true, &["nodes", "ls"]).json()[0]["status"] == "ready"
    });
    let (b, b_port) = replica(dir.path(), &data, &db.url, "b");
    assert_ne!(a_port, b_port);
    let (key, public) = keygen(dir.path(), "ada");
    let ada = tenant(&b.url, &admin, "ada", &public);
    let id = reserve_running(&b.url, &ada);

    // Through replica b, which holds no tunnel: relayed to a, then to the agent, which runs
    // the command in the instance.
    let (code, err) = ssh(dir.path(), b_port, &key, &id);
    assert_eq!(code, Some(0), "through the other replica: {err}");
    let a_log = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    let b_log = std::fs::read_to_string(dir.path().join("b.log")).unwrap();
    assert!(
        a_log.contains("tunnel: agent connected") && !b_log.contains("tunnel: agent connected"),
        "the agent must be connected to a only"
    );
    // And through a, directly.
    let (code, err) = ssh(dir.path(), a_port, &key, &id);
    assert_eq!(code, Some(0), "through its own replica: {err}");
    gpurent_agent::testing::kill_processes_naming(dir.path());
}
