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

/// The README's first run on a machine without a Docker Engine (its socket elsewhere) and
/// without GPUs: `up` with no executor flag runs work in the isolated process executor, not the
/// sim one, says so at start and in `nodes ls` (with the node's cores and memory), and
/// `-- echo hi` prints `hi` in `gpurent logs`. A command that cannot run ends `failed` and
/// says why in `get --json` and in the log.
#[test]
fn up_without_docker_runs_echo_hi_in_isolated_processes() {
    if !running_as_root() || std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") {
        eprintln!(
            "SKIPPED: the isolated process executor needs root (GPURENT_TEST_ISOLATION=0 skips)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("up.log");
    let up = Daemon::start_in_env(
        dir.path(),
        &["up", "--listen", "127.0.0.1:0", "--min-disk-free-gb", "0"],
        &[("DOCKER_HOST", "unix:///nonexistent/docker.sock")],
        &log,
    );
    let started = std::fs::read_to_string(&log).unwrap();
    assert!(
        started.contains("no Docker Engine answers on /nonexistent/docker.sock")
            && started.contains("running instances as isolated processes"),
        "up must say which executor it picked and why:\n{started}"
    );
    // This host's cores and memory, as the agent sees them (the same process tree).
    let cores = std::thread::available_parallelism().unwrap().get();
    let admin = std::fs::read_to_string(dir.path().join("gpurent-data/admin.token")).unwrap();
    let nodes = cli(&up.url, Some(admin.trim()), true, &["nodes", "ls"]).json();
    let node = &nodes[0];
    assert_eq!(node["executor"], "process", "{node}");
    assert_eq!(node["isolated"], true, "{node}");
    assert_eq!(node["gpu_backend"], "sim", "{node}");
    assert_eq!(node["cpus"], cores, "{node}");
    assert!(
        node["memory_mb"].as_u64().is_some_and(|mb| mb > 0),
        "{node}"
    );
    let table = cli(&up.url, Some(admin.trim()), false, &["nodes", "ls"]);
    assert!(
        table.stdout.contains("CPUS/MEM GB")
            && table.stdout.contains("process/sim")
            && table.stdout.contains(&format!(" {cores}/")),
        "{}",
        table.stdout
    );
    // Each of the 2 simulated GPUs brings at most half the host's cores (4 by default).
    let milli = (cores * 1000 / 2).min(4000);
    let cpus = if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{}.{}", milli / 1000, (milli % 1000) / 100)
    };
    assert!(
        started.contains(&format!("instance limits per GPU: {cpus} CPU and")),
        "{started}"
    );

    let alice = cli(
        &up.url,
        Some(admin.trim()),
        true,
        &["users", "create", "alice", "--credit", "10"],
    )
    .json();
    let token = alice["token"].as_str().unwrap().to_owned();
    let reserve = |command: &[&str]| {
        let r = cli(
            &up.url,
            Some(&token),
            true,
            &[
                &["reserve", "--gpu", "rtx4090", "--hours", "1", "--"],
                command,
            ]
            .concat(),
        );
        assert_eq!(r.code, 0, "{r:?}");
        r.json()["id"].as_str().unwrap().to_owned()
    };
    let ended = |id: &str| {
        let mut last = serde_json::Value::Null;
        eventually("the job to end", 30, || {
            last = cli(&up.url, Some(&token), true, &["get", id]).json();
            matches!(last["status"].as_str(), Some("stopped" | "failed"))
        });
        last
    };
    let hi = reserve(&["echo", "hi"]);
    let hi_limits = reserve(&["sh", "-c", "echo cpus=$GPURENT_CPUS"]);
    for id in [&hi, &hi_limits] {
        let last = ended(id);
        assert_eq!(last["status"], "stopped", "{last}");
        assert_eq!(last["end_reason"], "exited", "{last}");
        assert!(last.get("end_message").is_none(), "{last}");
    }
    let logs = cli(&up.url, Some(&token), false, &["logs", &hi]);
    assert!(logs.stdout.lines().any(|l| l == "hi"), "{logs:?}");
    let logs = cli(&up.url, Some(&token), false, &["logs", &hi_limits]);
    assert!(
        logs.stdout.lines().any(|l| l == format!("cpus={cpus}")),
        "the instance is told its CPU limit: {logs:?}"
    );

    let missing = reserve(&["/nonexistent/command"]);
    let last = ended(&missing);
    assert_eq!(last["status"], "failed", "{last}");
    let message = last["end_message"].as_str().unwrap_or_default();
    assert!(message.contains("exit"), "get --json says why: {last}");
    let logs = cli(&up.url, Some(&token), false, &["logs", &missing]);
    assert!(
        logs.stdout.contains("/nonexistent/command")
            && logs
                .stdout
                .contains(&format!("[gpurent] exited_with_error: {message}")),
        "{logs:?}"
    );
    let human = cli(&up.url, Some(&token), false, &["get", &missing]);
    assert!(
        human
            .stdout
            .contains(&format!("exited_with_error: {message}")),
        "{human:?}"
    );
}

/// `up` as a user who cannot isolate instances, without Docker: safe by default, it refuses
/// to start, saying both why and what to do (root, Docker, or `--allow-unisolated`).
#[test]
fn up_that_cannot_isolate_without_docker_says_what_to_do() {
    let setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !running_as_root() || !setpriv {
        eprintln!("SKIPPED: needs root and setpriv to run `up` as an unprivileged user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(crate::support::BIN)
        .args(["up", "--listen", "127.0.0.1:0", "--ssh-listen", "off"])
        .current_dir(dir.path())
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no Docker Engine answers on /nonexistent/docker.sock")
            && stderr.contains("cannot isolate instances on this host")
            && stderr.contains("root")
            && stderr.contains("--allow-unisolated"),
        "{stderr}"
    );
}
