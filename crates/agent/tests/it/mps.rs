//! The check of NVIDIA's MPS control daemon at agent start (`--mps`), against fake
//! `nvidia-cuda-mps-control` programs: one that answers, one that hangs, one that fails, none.

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use gpurent_agent::mps::{check_with, MpsError, MPS_CONTROL};

/// A directory with a fake control program running `script`, and the PATH that finds it.
fn fake(script: &str) -> (tempfile::TempDir, OsString) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join(MPS_CONTROL);
    std::fs::write(&program, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path =
        std::env::join_paths([dir.path(), Path::new("/usr/bin"), Path::new("/bin")]).unwrap();
    (dir, path)
}

#[tokio::test]
async fn a_daemon_that_answers_passes() {
    // The real one prints the servers' pids (none here) and exits 0.
    let (dir, path) = fake("read cmd; [ \"$cmd\" = get_server_list ] || exit 3");
    check_with(Some(path), Duration::from_secs(2))
        .await
        .unwrap();
    drop(dir);
}

#[tokio::test]
async fn a_daemon_that_hangs_is_named_and_what_it_started_is_killed() {
    let (dir, path) = fake(&format!(
        "sleep 60 & echo $! > {}/child; wait",
        "$(dirname $0)"
    ));
    let began = Instant::now();
    let err = check_with(Some(path), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, MpsError::NoAnswer { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("did not answer") && text.contains("nvidia-cuda-mps-control -d"),
        "{text}"
    );
    // Bounded by the timeout, not by the hung program (which would take 60 s).
    assert!(began.elapsed() < Duration::from_secs(30));
    let child: i32 = std::fs::read_to_string(dir.path().join("child"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{child}")).exists() && !zombie(child) {
        assert!(
            Instant::now() < deadline,
            "the hung program's child {child} still runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z")
    })
}

#[tokio::test]
async fn a_daemon_that_fails_says_what_it_said() {
    let (_dir, path) = fake("echo 'Cannot find MPS control daemon process' >&2; exit 1");
    let err = check_with(Some(path), Duration::from_secs(2))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MpsError::Failed { .. }), "{err:?}");
    assert!(
        text.contains("Cannot find MPS control daemon process"),
        "{text}"
    );
}

#[tokio::test]
async fn no_control_program_on_path_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = check_with(
        Some(dir.path().as_os_str().to_owned()),
        Duration::from_secs(2),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, MpsError::Missing), "{err:?}");
    assert!(err.to_string().contains("not on PATH"), "{err}");
    assert!(matches!(
        check_with(None, Duration::from_secs(2)).await,
        Err(MpsError::Missing)
    ));
}
