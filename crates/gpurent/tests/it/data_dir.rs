//! The control plane's data dir: private on disk (0700, its secrets and database 0600, also
//! when an older version left them readable), and held by one `up`/`server` at a time.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::Daemon;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every path in `paths` has `want`, else the panic names each that does not.
fn assert_modes(paths: &[std::path::PathBuf], want: u32) {
    let wrong: Vec<String> = paths
        .iter()
        .filter(|p| mode(p) != want)
        .map(|p| format!("{} is {:04o}", p.display(), mode(p)))
        .collect();
    assert!(wrong.is_empty(), "not {want:04o}: {wrong:?}");
}

#[test]
fn up_keeps_its_data_dir_secrets_and_database_private() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _up = Daemon::up_sim(
        &data,
        "1xRTX4090",
        &["--tls-self-signed"],
        &dir.path().join("up.log"),
    );
    // The node can be ready a moment before its agent has saved its identity.
    crate::support::eventually("the agent's identity saved", 10, || {
        data.join("agent/node.json").exists()
    });
    assert_modes(&[data.clone(), data.join("agent")], 0o700);
    let files = [
        "admin.token",
        "master.key",
        "tls.key",
        "ca.pem",
        "gpurent.db",
        "gpurent.db-wal",
        "gpurent.db-shm",
        "agent/node.json",
        "agent/node.key",
    ];
    assert_modes(&files.map(|f| data.join(f)), 0o600);
}

#[test]
fn a_readable_data_dir_of_an_older_version_is_made_private_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // What an older version left: a 0755 dir, a 0644 database and key.
    std::fs::create_dir(&data).unwrap();
    set_mode(&data, 0o755);
    std::fs::write(data.join("gpurent.db"), b"").unwrap();
    std::fs::write(data.join("master.key"), "ab".repeat(32)).unwrap();
    for f in ["gpurent.db", "master.key"] {
        set_mode(&data.join(f), 0o644);
    }
    let log = dir.path().join("server.log");
    let _server = Daemon::start(
        &[
            "server",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &log,
    );
    assert_modes(std::slice::from_ref(&data), 0o700);
    let files = [
        "gpurent.db",
        "gpurent.db-wal",
        "gpurent.db-shm",
        "master.key",
    ];
    assert_modes(&files.map(|f| data.join(f)), 0o600);
    let log = std::fs::read_to_string(&log).unwrap();
    for (path, old) in [
        (data.clone(), "0755"),
        (data.join("gpurent.db"), "0644"),
        (data.join("master.key"), "0644"),
    ] {
        let warned = log.lines().any(|l| {
            l.contains("WARN") && l.contains(&path.display().to_string()) && l.contains(old)
        });
        assert!(
            warned,
            "no warning naming {} and {old}:\n{log}",
            path.display()
        );
    }
}

#[test]
fn a_sqlite_database_outside_the_data_dir_is_private_too() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("db");
    std::fs::create_dir(&elsewhere).unwrap();
    set_mode(&elsewhere, 0o755);
    let db = elsewhere.join("control.db");
    let _server = Daemon::start(
        &[
            "server",
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--database-url",
            &format!("sqlite://{}", db.display()),
            "--listen",
            "127.0.0.1:0",
        ],
        &dir.path().join("server.log"),
    );
    let files = ["control.db", "control.db-wal", "control.db-shm"];
    assert_modes(&files.map(|f| elsewhere.join(f)), 0o600);
}

#[test]
fn a_second_server_on_one_sqlite_data_dir_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "server",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ];
    let mut first = Daemon::start(&args, &dir.path().join("first.log"));
    let (code, stderr) = exit_of(&args, &dir.path().join("second.log"));
    assert_eq!(
        code,
        Some(1),
        "a second server on the data dir must refuse to start; stderr:\n{stderr}"
    );
    let pid = first.child.id().to_string();
    assert!(
        stderr.contains(&pid) && stderr.contains(&first.url),
        "the refusal must name the running one (pid {pid}, {}):\n{stderr}",
        first.url
    );
    // `up` is refused the same way.
    let up = [
        "up",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--sim-gpus",
        "1xRTX4090",
        "--executor",
        "sim",
    ];
    let (code, stderr) = exit_of(&up, &dir.path().join("up.log"));
    assert!(
        code == Some(1) && stderr.contains(&pid),
        "up on a held data dir must be refused naming pid {pid}; exit {code:?}:\n{stderr}"
    );
    // The lock dies with its holder, even by SIGKILL.
    first.kill9();
    let again = Daemon::start(&args, &dir.path().join("again.log"));
    assert!(again.url.starts_with("http://127.0.0.1:"));
}

/// Runs `gpurent ARGS` until it exits, or for 20 s (then it is killed: `None`); its exit code
/// and stderr.
fn exit_of(args: &[&str], log: &Path) -> (Option<i32>, String) {
    let mut daemon = Daemon::start_quiet(args, log);
    let mut code = None;
    for _ in 0..400 {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            code = status.code();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(daemon);
    (code, std::fs::read_to_string(log).unwrap_or_default())
}
