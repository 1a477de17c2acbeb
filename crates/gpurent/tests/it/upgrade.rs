//! Upgrades from the previous release (its binary built by `scripts/previous-release.sh`,
//! named by `GPURENT_TEST_PREVIOUS_BIN`): its SQLite data dir opened by this release with
//! nothing lost and then by it again (a rollback), its replica serving beside one of this
//! release on one PostgreSQL database, and its agent running instances for this control
//! plane and then upgraded in place under them. The rolling upgrade of a whole HA stack under
//! load is `chaos::a_rolling_upgrade_under_load_meets_the_targets`.

use std::path::Path;
use std::process::Command;

use gpurent_store::testing::TestDatabase;
use gpurent_store::Backend;
use serde_json::Value;

use crate::support::{cli_of, eventually, instance_pgid, read_token, Cluster, Daemon, Run, BIN};

/// The previous release's `gpurent`, or None (the test then says it is skipped).
fn previous() -> Option<String> {
    match std::env::var("GPURENT_TEST_PREVIOUS_BIN") {
        Ok(bin) if !bin.is_empty() => {
            let version = Command::new(&bin).arg("--version").output().unwrap();
            let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
            assert_ne!(
                version,
                format!("gpurent {}", env!("CARGO_PKG_VERSION")),
                "GPURENT_TEST_PREVIOUS_BIN must be an earlier release"
            );
            Some(bin)
        }
        _ => {
            eprintln!(
                "SKIPPED: GPURENT_TEST_PREVIOUS_BIN is not set (scripts/test.sh builds it with \
                 scripts/previous-release.sh)"
            );
            None
        }
    }
}

/// `BIN up` on the data dir `data` with two simulated GPUs (the sim executor: nothing runs).
fn up(bin: &str, data: &Path, log: &Path) -> Daemon {
    let mut command = Command::new(bin);
    command.args([
        "up",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--sim-gpus",
        "2xRTX4090",
        "--executor",
        "sim",
        "--ssh-listen",
        "off",
    ]);
    Daemon::spawn(command, std::fs::File::create(log).unwrap())
}

/// `BIN server` on the shared data dir `data` and the PostgreSQL database `db`.
fn replica(bin: &str, data: &Path, db: &str, log: &Path) -> Daemon {
    let mut command = Command::new(bin);
    command.args([
        "server",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--ssh-listen",
        "off",
        "--database-url",
        db,
    ]);
    Daemon::spawn(command, std::fs::File::create(log).unwrap())
}

/// `BIN --server URL --json ARGS` as `token`, which must succeed.
fn ok(bin: &str, url: &str, token: &str, args: &[&str]) -> Value {
    let run: Run = cli_of(bin, url, &[], Some(token), true, args);
    assert_eq!(run.code, 0, "{bin} {args:?}: {run:?}");
    run.json()
}

fn reserve(bin: &str, url: &str, token: &str, command: &[&str]) -> String {
    let args = [
        &["reserve", "--gpu", "RTX-4090", "--hours", "1", "--"][..],
        command,
    ]
    .concat();
    ok(bin, url, token, &args)["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn status(bin: &str, url: &str, token: &str, id: &str) -> String {
    ok(bin, url, token, &["get", id])["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// What a reservation's record says, less what a release may add or a running one changes.
fn settled(r: &Value) -> Value {
    let keep = [
        "id",
        "status",
        "gpu_type",
        "tier",
        "price_per_hour",
        "node",
        "gpus",
        "command",
        "created_at",
        "started_at",
        "ended_at",
        "end_reason",
        "charged",
        "tenant_id",
        "epoch",
    ];
    keep.iter()
        .map(|k| ((*k).to_owned(), r[k].clone()))
        .collect()
}

/// The books and the audit trail check out, as `bin` computes them.
fn books_balance(bin: &str, url: &str, admin: &str) {
    for check in [&["admin", "ledger-check"][..], &["audit", "verify"]] {
        let run = cli_of(bin, url, &[], Some(admin), false, check);
        assert_eq!(run.code, 0, "{bin} {check:?}: {run:?}");
        assert!(run.stdout.starts_with("ok:"), "{bin} {check:?}: {run:?}");
    }
}

#[test]
fn a_data_dir_of_the_previous_release_opens_in_this_one_and_back_with_nothing_lost() {
    let Some(old) = previous() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    // The previous release writes the books: a tenant, a reservation stopped and charged, one
    // still running.
    let server = up(&old, &data, &dir.path().join("old.log"));
    let admin = read_token(&data);
    let tina = ok(
        &old,
        &server.url,
        &admin,
        &["users", "create", "tina", "--credit", "50"],
    );
    let tina = tina["token"].as_str().unwrap().to_owned();
    let done = reserve(&old, &server.url, &tina, &["sleep", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    ok(&old, &server.url, &tina, &["stop", &done]);
    eventually("stopped", 30, || {
        status(&old, &server.url, &tina, &done) == "stopped"
    });
    let running = reserve(&old, &server.url, &tina, &["sleep", "3600"]);
    eventually("running", 30, || {
        status(&old, &server.url, &tina, &running) == "running"
    });
    let done_before = settled(&ok(&old, &server.url, &tina, &["get", &done]));
    assert_ne!(done_before["charged"], "0.00", "{done_before}");
    books_balance(&old, &server.url, &admin);
    let terminated = server.terminate();
    assert!(terminated.success(), "{terminated:?}");

    // This release migrates it in place: the same records, the tenant's token, the running
    // reservation still running, books that balance and an audit chain that goes on.
    let server = up(BIN, &data, &dir.path().join("new.log"));
    assert_eq!(
        settled(&ok(BIN, &server.url, &tina, &["get", &done])),
        done_before
    );
    eventually("still running", 30, || {
        status(BIN, &server.url, &tina, &running) == "running"
    });
    let balance = ok(BIN, &server.url, &tina, &["balance"]);
    assert_eq!(balance["held"], "2.50", "{balance}");
    let fresh = reserve(BIN, &server.url, &tina, &["true"]);
    eventually("the new release's reservation running", 30, || {
        status(BIN, &server.url, &tina, &fresh) == "running"
    });
    ok(BIN, &server.url, &tina, &["stop", &fresh]);
    eventually("stopped", 30, || {
        status(BIN, &server.url, &tina, &fresh) == "stopped"
    });
    books_balance(BIN, &server.url, &admin);
    let terminated = server.terminate();
    assert!(terminated.success(), "{terminated:?}");

    // And the previous release opens the migrated dir again (a rollback): this release's
    // migrations only expand what it reads.
    let server = up(&old, &data, &dir.path().join("old-again.log"));
    assert_eq!(
        settled(&ok(&old, &server.url, &tina, &["get", &done])),
        done_before
    );
    let fresh_seen = ok(&old, &server.url, &tina, &["get", &fresh]);
    assert_eq!(fresh_seen["status"], "stopped", "{fresh_seen}");
    assert_eq!(
        status(&old, &server.url, &tina, &running),
        "running",
        "the first reservation outlived both restarts"
    );
    books_balance(&old, &server.url, &admin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_of_the_previous_release_serves_beside_one_of_this_release() {
    let Some(old) = previous() else { return };
    let db = TestDatabase::new(Backend::Postgres).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let a = replica(&old, &data, &db.url, &dir.path().join("a.log"));
    let admin = read_token(&data);
    let node = dir.path().join("node");
    let join = ok(&old, &a.url, &admin, &["nodes", "join-token"]);
    let _agent = Daemon::start_quiet(
        &[
            "--server",
            &a.url,
            "agent",
            "--join-token",
            join["token"].as_str().unwrap(),
            "--data-dir",
            node.to_str().unwrap(),
            "--name",
            "box-1",
            "--sim-gpus",
            "2xRTX4090",
            "--executor",
            "sim",
        ],
        &dir.path().join("agent.log"),
    );
    eventually("the node ready", 30, || {
        ok(&old, &a.url, &admin, &["nodes", "ls"])[0]["status"] == "ready"
    });
    let tina = ok(
        &old,
        &a.url,
        &admin,
        &["users", "create", "tina", "--credit", "50"],
    );
    let tina = tina["token"].as_str().unwrap().to_owned();
    let on_old = reserve(&old, &a.url, &tina, &["sleep", "3600"]);

    // This release's replica starts on the database the old one serves (and migrates it):
    // each sees and changes what the other wrote.
    let b = replica(BIN, &data, &db.url, &dir.path().join("b.log"));
    eventually("running, seen by the new replica", 30, || {
        status(BIN, &b.url, &tina, &on_old) == "running"
    });
    let on_new = reserve(BIN, &b.url, &tina, &["sleep", "3600"]);
    eventually("running, seen by the old replica", 30, || {
        status(&old, &a.url, &tina, &on_new) == "running"
    });
    ok(&old, &a.url, &tina, &["stop", &on_new]);
    ok(BIN, &b.url, &tina, &["stop", &on_old]);
    for (bin, url) in [(old.as_str(), a.url.as_str()), (BIN, b.url.as_str())] {
        for id in [&on_old, &on_new] {
            eventually("stopped", 30, || status(bin, url, &tina, id) == "stopped");
        }
    }
    books_balance(&old, &a.url, &admin);
    books_balance(BIN, &b.url, &admin);

    // An old replica restarted mid-upgrade runs its migrations against the newer schema.
    drop(a);
    let a = replica(&old, &data, &db.url, &dir.path().join("a-again.log"));
    assert_eq!(status(&old, &a.url, &tina, &on_new), "stopped");
    books_balance(&old, &a.url, &admin);
}

#[test]
fn an_agent_of_the_previous_release_runs_instances_and_is_upgraded_under_them() {
    let Some(old) = previous() else { return };
    let cluster = Cluster::start("127.0.0.1:0");
    let args = cluster.agent_args("box-1", &[]);
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent_log = cluster.dir.path().join("old-agent.log");
    let agent = Daemon::start_quiet_with(&old, &arg_refs, &agent_log);
    cluster.wait_ready(1);
    let agent_check = |cluster: &Cluster| -> String {
        cluster.nodes()[0]["verification"]["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "agent"))
            .and_then(|c| c["detail"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        agent_check(&cluster),
        "an earlier release (agent protocol 1)"
    );

    // It runs this control plane's instances: one to its end, one that goes on.
    let tina = cluster.tenant("tina");
    let said = cluster.reserve(
        &tina,
        &[
            "--gpu",
            "RTX-4090",
            "--hours",
            "1",
            "--",
            "echo",
            "from the previous release's agent",
        ],
    );
    eventually("the command's output", 30, || {
        let logs = cluster.cli(Some(&tina), false, &["logs", &said]);
        logs.stdout.contains("from the previous release's agent")
    });
    eventually("stopped", 30, || {
        cluster.get(&tina, &said)["status"] == "stopped"
    });
    let long = cluster.reserve(
        &tina,
        &["--gpu", "RTX-4090", "--hours", "1", "--", "sleep", "3600"],
    );
    eventually("running", 30, || {
        cluster.get(&tina, &long)["status"] == "running"
    });
    let node_dir = cluster.dir.path().join("box-1");
    let pgid = instance_pgid(&node_dir, &long);

    // The agent is upgraded in place, as the package does it (SIGTERM, the new binary on the
    // same data dir): the instance goes on, the same process, under the new agent.
    let stopped = agent.terminate();
    assert!(stopped.success(), "{stopped:?}");
    // Without the join token: the node keeps the identity it registered.
    let at = arg_refs.iter().position(|a| *a == "--join-token").unwrap();
    let new_args = [&arg_refs[..at], &arg_refs[at + 2..]].concat();
    let _agent = Daemon::start_quiet(&new_args, &cluster.dir.path().join("new-agent.log"));
    eventually("the upgraded agent reports its release", 30, || {
        agent_check(&cluster) == format!("gpurent {}", env!("CARGO_PKG_VERSION"))
    });
    assert_eq!(cluster.get(&tina, &long)["status"], "running");
    assert_eq!(instance_pgid(&node_dir, &long), pgid);
    let alive = Command::new("kill")
        .args(["-0", "--", &format!("-{pgid}")])
        .status()
        .unwrap();
    assert!(
        alive.success(),
        "the instance's processes outlived the agent's upgrade"
    );
    let stop = cluster.cli(Some(&tina), true, &["stop", &long]);
    assert_eq!(stop.code, 0, "{stop:?}");
    eventually("stopped by the new agent", 30, || {
        cluster.get(&tina, &long)["status"] == "stopped"
    });
    cluster.ledger_check();
}
