//! The secrets every replica shares, sealed in the database by the master key: a second
//! `gpurent server` given only the database and the master key (an empty data dir of its own)
//! signs audit checkpoints the first verifies, serves the same certificate, and each accepts
//! the agents whose node certificates the other issued; replicas racing at first start end with one
//! key set; a wrong master key is refused with its message; keys an older version kept in the
//! data dir are imported, and a data dir whose key is not the database's is refused.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpurent_store::testing::TestDatabase;
use gpurent_store::Backend;

use crate::ssh_support::{keygen, run_bounded};
use crate::support::{cli_with, eventually, read_token, Daemon, BIN};

const MASTER: &str = "4d4153544552204b4559204f4620544845205245504c49434153212121212121";
const OTHER_MASTER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The arguments of `gpurent server` on `db`, with TLS (self-signed) and SSH.
fn server_args<'a>(data: &'a Path, db: &'a str) -> Vec<&'a str> {
    vec![
        "server",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        db,
        "--tls-self-signed",
        "--ssh-listen",
        "127.0.0.1:0",
    ]
}

/// A replica with its own data dir under `dir`, given the master key in the environment.
fn replica(dir: &Path, name: &str, db: &str) -> (Daemon, PathBuf) {
    let data = dir.join(name);
    let daemon = Daemon::start_in_env(
        Path::new("."),
        &server_args(&data, db),
        &[("GPURENT_MASTER_KEY", MASTER)],
        &dir.join(format!("{name}.log")),
    );
    (daemon, data)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The pin of the certificate a replica serves.
fn pin(data: &Path) -> Vec<String> {
    vec![
        "--tls-fingerprint".to_owned(),
        read(&data.join("tls.fingerprint")).trim().to_owned(),
    ]
}

#[test]
fn a_second_replica_with_only_the_master_key_shares_every_key() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let db = runtime
        .block_on(TestDatabase::new(Backend::Postgres))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (a, a_data) = replica(dir.path(), "a", &db.url);
    let admin = read_token(&a_data);
    let (b, b_data) = replica(dir.path(), "b", &db.url);
    assert!(!b_data.join("admin.token").exists(), "b is not the first");
    for file in ["audit.key", "ca.key.sealed", "ca.key", "master.key"] {
        assert!(!b_data.join(file).exists(), "{file} in b's data dir");
    }
    // The same certificate, CA and SSH host key, made by a, read by b from the database.
    for file in ["tls.fingerprint", "ca.pem", "ssh_host_ed25519_key.pub"] {
        assert_eq!(read(&a_data.join(file)), read(&b_data.join(file)), "{file}");
    }
    let tls = pin(&a_data);
    assert_eq!(tls, pin(&b_data));

    // The trail's first record is b's (the first request of all), so b signs its first
    // checkpoint; a verifies it with its own key.
    let join = cli_with(&b.url, &tls, Some(&admin), true, &["nodes", "join-token"]);
    assert_eq!(join.code, 0, "{join:?}");
    let by_b = cli_with(&b.url, &tls, Some(&admin), true, &["audit", "verify"]).json();
    assert!(by_b["checkpoints"].as_u64().unwrap() >= 1, "{by_b}");
    let by_a = cli_with(&a.url, &tls, Some(&admin), true, &["audit", "verify"]).json();
    assert_eq!(by_a["ok"], true, "a verifies b's checkpoints: {by_a}");
    assert!(by_a["checkpoints"].as_u64().unwrap() >= 1, "{by_a}");
    assert_eq!(by_a["public_key"], by_b["public_key"]);

    // One agent joins through a, one through b, over TLS: each node certificate is signed by
    // the replica it joined through, with the one CA.
    let token = join.json()["token"].as_str().unwrap().to_owned();
    let agent_args = |name: &str, gpus: &str, url: &str| -> Vec<String> {
        let mut args = tls.clone();
        let data = dir.path().join(name);
        args.extend(
            [
                "--server",
                url,
                "agent",
                "--data-dir",
                data.to_str().unwrap(),
                "--name",
                name,
                "--sim-gpus",
                gpus,
                "--executor",
                "sim",
                "--join-token",
                &token,
            ]
            .map(str::to_owned),
        );
        args
    };
    let start_agent = |name: &str, gpus: &str, url: &str, log: &str| {
        let args = agent_args(name, gpus, url);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Daemon::start_quiet(&args, &dir.path().join(log))
    };
    let nodes_ready = || {
        let nodes = cli_with(&a.url, &tls, Some(&admin), true, &["nodes", "ls"]).json();
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        nodes.len() == 2 && nodes.iter().all(|n| n["status"] == "ready")
    };
    let mut via_a = start_agent("via-a", "1xRTX4090", &a.url, "via-a.log");
    let mut via_b = start_agent("via-b", "1xA100-80GB", &b.url, "via-b.log");
    eventually("both agents to join", 30, nodes_ready);
    for agent in ["via-a", "via-b"] {
        let ca = dir.path().join(agent).join("node-ca.pem");
        eventually("the agent's identity saved", 10, || ca.exists());
        assert_eq!(read(&ca), read(&a_data.join("ca.pem")), "{agent}");
    }

    // Each agent restarted against the other replica is accepted there: that replica gives
    // it a reservation and hears it run (every sync needs the certificate the other issued).
    via_a.kill9();
    via_b.kill9();
    let _via_a = start_agent("via-a", "1xRTX4090", &b.url, "via-a-on-b.log");
    let _via_b = start_agent("via-b", "1xA100-80GB", &a.url, "via-b-on-a.log");
    let tenant = cli_with(
        &a.url,
        &tls,
        Some(&admin),
        true,
        &["users", "create", "ada", "--credit", "500"],
    )
    .json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    for (gpu, url, replica) in [("RTX-4090", &b.url, "b"), ("A100-80GB", &a.url, "a")] {
        let args = ["reserve", "--gpu", gpu, "--hours", "1", "--", "sleep", "60"];
        let reserved = cli_with(url, &tls, Some(&tenant), true, &args);
        assert_eq!(reserved.code, 0, "{reserved:?}");
        let id = reserved.json()["id"].as_str().unwrap().to_owned();
        eventually(
            &format!("the {gpu} reservation running through {replica}"),
            30,
            || {
                cli_with(url, &tls, Some(&tenant), true, &["get", &id]).json()["status"]
                    == "running"
            },
        );
    }
    // Still the two nodes of the first joins: neither agent joined again (which would have
    // given it a certificate of the replica it talks to now).
    let nodes = cli_with(&a.url, &tls, Some(&admin), true, &["nodes", "ls"]).json();
    assert_eq!(nodes.as_array().map(Vec::len), Some(2), "{nodes}");
    for url in [&a.url, &b.url] {
        let verdict = cli_with(url, &tls, Some(&admin), true, &["audit", "verify"]).json();
        assert_eq!(verdict["ok"], true, "{verdict}");
    }
}

#[test]
fn replicas_racing_at_first_start_end_with_one_key_set() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let db = runtime
        .block_on(TestDatabase::new(Backend::Postgres))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let started: Vec<(Daemon, PathBuf)> = std::thread::scope(|scope| {
        let spawned: Vec<_> = ["r1", "r2", "r3"]
            .map(|name| {
                let (dir, url) = (dir.path(), db.url.as_str());
                scope.spawn(move || replica(dir, name, url))
            })
            .into_iter()
            .collect();
        let joined: Vec<_> = spawned.into_iter().map(|s| s.join()).collect();
        if joined.iter().any(Result::is_err) {
            let logs: Vec<String> = ["r1", "r2", "r3"]
                .map(|name| {
                    let log = dir.path().join(format!("{name}.log"));
                    format!(
                        "{name}:\n{}",
                        std::fs::read_to_string(log).unwrap_or_default()
                    )
                })
                .into();
            panic!("a replica did not start:\n{}", logs.join("\n"));
        }
        joined.into_iter().map(Result::unwrap).collect()
    });
    let first = &started[0].1;
    for (_, data) in &started[1..] {
        for file in ["tls.fingerprint", "ca.pem", "ssh_host_ed25519_key.pub"] {
            assert_eq!(read(&first.join(file)), read(&data.join(file)), "{file}");
        }
    }
    let admins: Vec<_> = started
        .iter()
        .filter(|(_, data)| data.join("admin.token").exists())
        .collect();
    assert_eq!(admins.len(), 1, "one admin, made once");
    let admin = read_token(&admins[0].1);
    let tls = pin(first);
    let keys: Vec<_> = started
        .iter()
        .map(|(daemon, _)| {
            let verdict = cli_with(&daemon.url, &tls, Some(&admin), true, &["audit", "verify"]);
            assert_eq!(verdict.code, 0, "{verdict:?}");
            verdict.json()["public_key"].clone()
        })
        .collect();
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
}

#[test]
fn a_wrong_master_key_is_refused_with_its_message() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let db = runtime
        .block_on(TestDatabase::new(Backend::Postgres))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_a, _) = replica(dir.path(), "a", &db.url);
    let data = dir.path().join("c");
    let out = run_bounded({
        let mut cmd = Command::new(BIN);
        cmd.args(server_args(&data, &db.url))
            .env("GPURENT_MASTER_KEY", OTHER_MASTER);
        cmd
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let given = gpurent_server::secrets::LocalKey::from_hex(OTHER_MASTER).unwrap();
    let sealed_with = gpurent_server::secrets::LocalKey::from_hex(MASTER).unwrap();
    use gpurent_server::secrets::KeyProvider;
    assert!(
        stderr.contains(&format!(
            "is sealed with master key {}, but this control plane was given master key {}",
            sealed_with.key_id(),
            given.key_id()
        )) && stderr.contains("GPURENT_MASTER_KEY or --master-key-file"),
        "{stderr}"
    );
    // Nothing of the database's was written in clear to the refused replica's data dir.
    assert!(!data.join("ssh_host_ed25519_key").exists());
}

#[test]
fn keys_in_a_data_dir_are_imported_and_a_different_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    // What an older version left: the audit key and the SSH host key as files.
    let seed = "07".repeat(32);
    std::fs::write(data.join("audit.key"), &seed).unwrap();
    let (host_key, host_pub) = keygen(dir.path(), "host", "");
    std::fs::copy(&host_key, data.join("ssh_host_ed25519_key")).unwrap();
    let args = [
        "server",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--ssh-listen",
        "127.0.0.1:0",
    ];
    let server = Daemon::start(&args, &dir.path().join("server.log"));
    let admin = read_token(&data);
    let verdict = cli_with(&server.url, &[], Some(&admin), true, &["audit", "verify"]).json();
    let expected = gpurent_audit::Signer::from_seed_hex(&seed)
        .unwrap()
        .public_key();
    assert_eq!(verdict["public_key"], expected.as_str(), "{verdict}");
    let served: Vec<String> = read(&data.join("ssh_host_ed25519_key.pub"))
        .split_whitespace()
        .take(2)
        .map(str::to_owned)
        .collect();
    let imported: Vec<String> = read(&host_pub)
        .split_whitespace()
        .take(2)
        .map(str::to_owned)
        .collect();
    assert_eq!(served, imported);
    drop(server);

    // Now in the database: without the files, the same keys.
    std::fs::remove_file(data.join("audit.key")).unwrap();
    std::fs::remove_file(data.join("ssh_host_ed25519_key")).unwrap();
    let server = Daemon::start(&args, &dir.path().join("server2.log"));
    let verdict = cli_with(&server.url, &[], Some(&admin), true, &["audit", "verify"]).json();
    assert_eq!(verdict["public_key"], expected.as_str(), "{verdict}");
    drop(server);

    // Another audit key in the data dir than the database's: refused, naming both.
    let other = "08".repeat(32);
    std::fs::write(data.join("audit.key"), &other).unwrap();
    let out = run_bounded({
        let mut cmd = Command::new(BIN);
        cmd.args(args);
        cmd
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let other_public = gpurent_audit::Signer::from_seed_hex(&other)
        .unwrap()
        .public_key();
    assert!(
        stderr.contains(&data.join("audit.key").display().to_string())
            && stderr.contains(&other_public)
            && stderr.contains(&expected)
            && stderr.contains("refusing to start"),
        "{stderr}"
    );
}
