//! The control plane's SSH endpoint with the real OpenSSH client against a real `gpurent up`:
//! who gets in (the owner's key, a running reservation), what the others are told, and a
//! host key that survives a restart. The channel reaches the agent through its tunnel: the
//! sim executor of this node says there is nothing to enter.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ssh_support::keygen as keygen_with;
pub(crate) use crate::ssh_support::run_bounded;
use crate::support::{cli, eventually, read_token, Daemon};

/// A fresh ed25519 key pair without a passphrase: (private, public).
pub(crate) fn keygen(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    keygen_with(dir, name, "")
}

pub(crate) const NOTHING_TO_ENTER: &str =
    "gpurent: the sim executor runs nothing: there is no instance to enter";

/// `ssh -i KEY -p PORT USER@127.0.0.1 true`, never prompting, never hanging.
pub(crate) fn ssh(dir: &Path, port: u16, key: &Path, user: &str) -> (Option<i32>, String) {
    let mut cmd = Command::new("ssh");
    cmd.arg("-i")
        .arg(key)
        .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
        .args(["-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5"])
        .arg("-o")
        .arg(format!(
            "UserKnownHostsFile={}",
            dir.join("known_hosts").display()
        ))
        .args(["-F", "/dev/null", "-p", &port.to_string()])
        .arg(format!("{user}@127.0.0.1"))
        .arg("true");
    let out = run_bounded(cmd);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The key the endpoint offers, as `ssh-keyscan` prints it ("TYPE BASE64").
fn scanned_key(port: u16) -> String {
    let mut cmd = Command::new("ssh-keyscan");
    cmd.args([
        "-T",
        "5",
        "-t",
        "ed25519",
        "-p",
        &port.to_string(),
        "127.0.0.1",
    ]);
    let out = run_bounded(cmd);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| !l.starts_with('#') && !l.trim().is_empty())
        .unwrap_or_else(|| panic!("ssh-keyscan printed no key: {text:?} {:?}", out.stderr));
    line.split_whitespace()
        .skip(1)
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn start_up(dir: &Path, data: &Path, log: &str) -> (Daemon, u16) {
    let up = Daemon::start(
        &[
            "up",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--ssh-listen",
            "127.0.0.1:0",
            "--sim-gpus",
            "2xRTX4090",
            "--executor",
            "sim",
        ],
        &dir.join(log),
    );
    let addr = std::fs::read_to_string(data.join("ssh.addr")).expect("DATA_DIR/ssh.addr");
    let port = addr
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("ssh.addr {addr:?}"));
    (up, port)
}

pub(crate) fn tenant(url: &str, admin: &str, name: &str, key: &Path) -> String {
    let user = cli(
        url,
        Some(admin),
        true,
        &["users", "create", name, "--credit", "100"],
    );
    assert_eq!(user.code, 0, "{user:?}");
    let token = user.json()["token"].as_str().unwrap().to_owned();
    let added = cli(
        url,
        Some(&token),
        true,
        &["keys", "add", key.to_str().unwrap()],
    );
    assert_eq!(added.code, 0, "{added:?}");
    token
}

pub(crate) fn reserve_running(url: &str, token: &str) -> String {
    let r = cli(
        url,
        Some(token),
        true,
        &[
            "reserve", "--gpu", "RTX-4090", "--hours", "1", "--", "sleep", "3600",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    eventually("running", 30, || {
        cli(url, Some(token), true, &["get", &id]).json()["status"] == "running"
    });
    id
}

#[test]
fn ssh_lets_the_owner_in_refuses_others_and_keeps_its_host_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (up, port) = start_up(dir.path(), &data, "up.log");
    let url = up.url.clone();
    let admin = read_token(&data);
    let (ada_key, ada_pub) = keygen(dir.path(), "ada");
    let (bob_key, bob_pub) = keygen(dir.path(), "bob");
    let ada = tenant(&url, &admin, "ada", &ada_pub);
    let _bob = tenant(&url, &admin, "bob", &bob_pub);
    let id = reserve_running(&url, &ada);

    // The owner's key and a running reservation: in, and through the tunnel to the agent,
    // whose sim executor has nothing to enter.
    let (code, err) = ssh(dir.path(), port, &ada_key, &id);
    assert_eq!(code, Some(255), "{err}");
    assert!(err.contains(NOTHING_TO_ENTER), "{err}");
    // The session is in the audit trail: who, which key, refused by the instance.
    let resource = format!("/ssh/{id}/exec");
    let mut records = serde_json::Value::Null;
    eventually("the session's audit record", 10, || {
        records = cli(
            &url,
            Some(&admin),
            true,
            &[
                "audit",
                "ls",
                "--resource",
                &resource,
                "--from",
                "2020-01-01",
            ],
        )
        .json();
        records.as_array().is_some_and(|r| !r.is_empty())
    });
    let record = &records[0];
    assert_eq!(record["action"], "SSH exec", "{record}");
    assert_eq!(record["outcome"], 403, "{record}");
    let detail = record["allocation"].as_str().unwrap();
    assert!(
        detail.starts_with("key SHA256:") && detail.contains("bytes in"),
        "{detail}"
    );

    // Someone else's key, and an unknown reservation: the same refusal.
    let (code, err) = ssh(dir.path(), port, &bob_key, &id);
    assert_eq!(code, Some(255), "{err}");
    assert!(err.contains("Permission denied (publickey)"), "{err}");
    assert!(
        !err.contains("running") && !err.contains("reservation"),
        "{err}"
    );
    let (code, unknown) = ssh(dir.path(), port, &ada_key, "r-does-not-exist");
    assert_eq!(code, Some(255), "{unknown}");
    assert!(
        unknown.contains("Permission denied (publickey)"),
        "{unknown}"
    );

    // A stopped reservation: its owner is told so.
    let stopped = cli(&url, Some(&ada), true, &["stop", &id]);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    eventually("stopped", 30, || {
        cli(&url, Some(&ada), true, &["get", &id]).json()["status"] == "stopped"
    });
    let (code, err) = ssh(dir.path(), port, &ada_key, &id);
    assert_eq!(code, Some(255), "{err}");
    assert!(
        err.contains(&format!("reservation {id} is stopped (ended at ")),
        "{err}"
    );
    // Bob still learns nothing about it.
    let (_, err) = ssh(dir.path(), port, &bob_key, &id);
    assert!(
        err.contains("Permission denied (publickey)") && !err.contains("stopped"),
        "{err}"
    );

    // The host key: the .pub is what is served, and both survive a restart.
    let public = std::fs::read_to_string(data.join("ssh_host_ed25519_key.pub")).unwrap();
    let public = public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let before = scanned_key(port);
    assert_eq!(before, public);
    let status = up.terminate();
    assert!(status.success(), "up exited with {status}");
    let (_up, port) = start_up(dir.path(), &data, "up2.log");
    assert_eq!(scanned_key(port), before, "the host key changed on restart");
    let again = std::fs::read_to_string(data.join("ssh_host_ed25519_key.pub")).unwrap();
    assert!(again.starts_with(&public), "{again}");
}
