//! `gpurent keys add|ls|rm` with keys made by the real `ssh-keygen`, whose `-lf` fingerprint
//! the CLI must print exactly.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::{cli, read_token, Daemon, BIN};

/// A fresh key pair made by ssh-keygen; its public half's path.
fn keygen(dir: &Path, name: &str, kind: &[&str]) -> std::path::PathBuf {
    let private = dir.join(name);
    let status = Command::new("ssh-keygen")
        .args(["-q", "-N", "", "-C", &format!("{name}@test"), "-f"])
        .arg(&private)
        .args(["-t"])
        .args(kind)
        .status()
        .expect("ssh-keygen (openssh-client; scripts/test.sh installs it)");
    assert!(status.success());
    private.with_extension("pub")
}

/// `ssh-keygen -lf FILE`'s fingerprint.
fn fingerprint(public: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(public)
        .output()
        .expect("ssh-keygen");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .expect("a fingerprint")
        .to_owned()
}

#[test]
fn keys_through_the_cli_match_ssh_keygen() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Daemon::server(&data, &dir.path().join("server.log"));
    let url = server.url.clone();
    let admin = read_token(&data);
    let ada = cli(&url, Some(&admin), true, &["users", "create", "ada"]).json();
    let token = ada["token"].as_str().unwrap().to_owned();

    let ed = keygen(dir.path(), "ed", &["ed25519"]);
    let added = cli(
        &url,
        Some(&token),
        true,
        &["keys", "add", ed.to_str().unwrap(), "--name", "laptop"],
    );
    assert_eq!(added.code, 0, "{added:?}");
    let added = added.json();
    assert_eq!(added["fingerprint"], fingerprint(&ed));
    assert_eq!(added["name"], "laptop");
    let id = added["id"].as_str().unwrap().to_owned();

    // From stdin, named by its comment.
    let rsa = keygen(dir.path(), "rsa", &["rsa", "-b", "3072"]);
    let mut child = Command::new(BIN)
        .args([
            "--server", &url, "--token", &token, "--json", "keys", "add", "-",
        ])
        .env_remove("GPURENT_TOKEN")
        .env("GPURENT_DATA_DIR", "/nonexistent")
        .stdin(std::fs::File::open(&rsa).unwrap())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(child.wait().unwrap().success(), "{out}");
    let from_stdin: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(from_stdin["fingerprint"], fingerprint(&rsa));
    assert_eq!(from_stdin["name"], "rsa@test");

    // A short RSA key and a private key are refused, saying why; the private one is never sent.
    let short = keygen(dir.path(), "short", &["rsa", "-b", "2048"]);
    let refused = cli(
        &url,
        Some(&token),
        true,
        &["keys", "add", short.to_str().unwrap()],
    );
    assert_ne!(refused.code, 0);
    assert_eq!(
        refused.json()["error"]["code"],
        "invalid_value",
        "{refused:?}"
    );
    assert!(refused.stdout.contains("3072"), "{refused:?}");
    let private = dir.path().join("ed");
    let refused = cli(
        &url,
        Some(&token),
        true,
        &["keys", "add", private.to_str().unwrap()],
    );
    assert_ne!(refused.code, 0);
    assert!(refused.stdout.contains("private key"), "{refused:?}");
    let again = cli(
        &url,
        Some(&token),
        true,
        &["keys", "add", ed.to_str().unwrap()],
    );
    assert_eq!(again.json()["error"]["code"], "duplicate", "{again:?}");

    // The table and the JSON list; removal.
    let table = cli(&url, Some(&token), false, &["keys", "ls"]);
    assert_eq!(table.code, 0, "{table:?}");
    assert!(table.stdout.contains(&fingerprint(&ed)), "{table:?}");
    assert!(table.stdout.contains("FINGERPRINT"), "{table:?}");
    let listed = cli(&url, Some(&token), true, &["keys", "ls"]).json();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    let removed = cli(&url, Some(&token), true, &["keys", "rm", &id]);
    assert_eq!(removed.code, 0, "{removed:?}");
    assert_eq!(removed.json()["id"], id.as_str());
    let listed = cli(&url, Some(&token), true, &["keys", "ls"]).json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let gone = cli(&url, Some(&token), true, &["keys", "rm", &id]);
    assert_eq!(gone.json()["error"]["code"], "not_found", "{gone:?}");
}
