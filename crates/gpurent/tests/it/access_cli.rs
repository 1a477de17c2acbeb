//! Passwords, logins and tokens through the CLI: `users passwd`, `login`, `tokens create|ls|
//! revoke`, `users limits`, against `gpurent server`.

use std::process::Command;

use serde_json::Value;

use crate::support::{cli, read_token, Daemon, BIN};

/// `gpurent --json ARGS` with the password in GPURENT_PASSWORD.
fn with_password(url: &str, token: Option<&str>, password: &str, args: &[&str]) -> (i32, Value) {
    let mut cmd = Command::new(BIN);
    cmd.args(["--server", url, "--json"])
        .env_remove("GPURENT_TOKEN")
        .env("GPURENT_DATA_DIR", "/nonexistent")
        .env("GPURENT_PASSWORD", password);
    if let Some(token) = token {
        cmd.args(["--token", token]);
    }
    let out = cmd.args(args).output().expect("run gpurent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
    )
}

#[test]
fn tokens_and_logins_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Daemon::server(&data, &dir.path().join("server.log"));
    let url = server.url.clone();
    let admin = read_token(&data);
    let alice = cli(&url, Some(&admin), true, &["users", "create", "alice"]).json();
    let token = alice["token"].as_str().unwrap().to_owned();
    let id = alice["id"].as_str().unwrap().to_owned();

    let (code, _) = with_password(
        &url,
        Some(&token),
        "correct horse battery",
        &["users", "passwd"],
    );
    assert_eq!(code, 0);
    let (code, session) = with_password(&url, None, "correct horse battery", &["login", "alice"]);
    assert_eq!(code, 0, "{session}");
    let console = session["token"].as_str().unwrap().to_owned();
    assert_eq!(cli(&url, Some(&console), true, &["balance"]).code, 0);
    let (code, refused) = with_password(&url, None, "wrong", &["login", "alice"]);
    assert_ne!(code, 0);
    assert_eq!(refused["error"]["code"], "unauthorized", "{refused}");

    // From a twelve-hour session, a token of its own only with the password.
    let (code, own) = with_password(
        &url,
        Some(&console),
        "correct horse battery",
        &["tokens", "create", "--with-password", "--name", "own"],
    );
    assert_eq!(code, 0, "{own}");
    assert!(own["expires_at"].is_null(), "{own}");
    let bound = cli(&url, Some(&console), true, &["tokens", "create"]).json();
    assert_eq!(bound["expires_at"], session["expires_at"], "{bound}");

    let made = cli(
        &url,
        Some(&token),
        true,
        &[
            "tokens",
            "create",
            "--name",
            "ci",
            "--expires-in-days",
            "30",
        ],
    );
    assert_eq!(made.code, 0, "{made:?}");
    let made = made.json();
    let ci = made["token"].as_str().unwrap().to_owned();
    let listed = cli(&url, Some(&token), true, &["tokens", "ls"]).json();
    assert_eq!(listed.as_array().unwrap().len(), 5, "{listed}");
    let revoked = cli(
        &url,
        Some(&token),
        true,
        &["tokens", "revoke", made["id"].as_str().unwrap()],
    );
    assert_eq!(revoked.code, 0, "{revoked:?}");
    let refused = cli(&url, Some(&ci), true, &["balance"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("revoked"),
        "{refused:?}"
    );

    let limits = cli(
        &url,
        Some(&admin),
        true,
        &[
            "users",
            "limits",
            &id,
            "--max-reservations",
            "4",
            "--max-spend-per-hour",
            "10",
        ],
    );
    assert_eq!(limits.code, 0, "{limits:?}");
    assert_eq!(limits.json()["max_reservations"], 4);
    server.terminate();
}
