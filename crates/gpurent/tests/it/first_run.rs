//! A first run as the README has it: `gpurent up` in a fresh directory, its data dir the
//! default relative `./gpurent-data`, work in the isolated process executor, and the job's
//! output in `gpurent logs`.

use crate::support::{cli, eventually, Daemon};

/// `/proc/self` belongs to the process's effective user.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[test]
fn up_in_a_fresh_directory_runs_a_job_in_the_process_executor() {
    if !running_as_root() || std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") {
        eprintln!(
            "SKIPPED: the isolated process executor needs root (GPURENT_TEST_ISOLATION=0 skips)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let up = Daemon::start_in(
        dir.path(),
        &[
            "up",
            "--listen",
            "127.0.0.1:0",
            "--executor",
            "process",
            "--min-disk-free-gb",
            "0",
        ],
        &dir.path().join("up.log"),
    );
    let admin = std::fs::read_to_string(dir.path().join("gpurent-data/admin.token")).unwrap();
    let alice = cli(
        &up.url,
        Some(admin.trim()),
        true,
        &["users", "create", "alice", "--credit", "10"],
    )
    .json();
    let token = alice["token"].as_str().unwrap().to_owned();
    let reserved = cli(
        &up.url,
        Some(&token),
        true,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--",
            "sh",
            "-c",
            "echo hello from $HOME; pwd",
        ],
    );
    assert_eq!(reserved.code, 0, "{reserved:?}");
    let id = reserved.json()["id"].as_str().unwrap().to_owned();
    let mut last = serde_json::Value::Null;
    eventually("the job to end", 30, || {
        last = cli(&up.url, Some(&token), true, &["get", &id]).json();
        matches!(last["status"].as_str(), Some("stopped" | "failed"))
    });
    let logs = cli(&up.url, Some(&token), false, &["logs", &id]);
    assert_eq!(last["status"], "stopped", "{last}\nlog: {}", logs.stdout);
    assert_eq!(last["end_reason"], "exited", "{last}");
    assert!(logs.stdout.contains("hello from /instance"), "{logs:?}");
}
