//! `gpurent agent --mps` (issue 17) refuses to start unless NVIDIA's MPS control daemon
//! answers within 2 s, naming the problem and how to fix it: checked with fake
//! `nvidia-cuda-mps-control` programs on its PATH (one that hangs, one that answers, none).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::BIN;

/// Kills the agent if the test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpurent agent --mps` with `bin` first on its PATH, against a control plane that is not
/// there; its exit status (None: still running after 15 s) and its log.
fn agent_with_mps(dir: &Path, bin: &Path) -> (Option<std::process::ExitStatus>, String) {
    let log = dir.join("agent.log");
    let path = std::env::join_paths([bin, Path::new("/usr/bin"), Path::new("/bin")]).unwrap();
    let child = Command::new(BIN)
        .args(["--server", "http://127.0.0.1:9", "agent", "--data-dir"])
        .arg(dir.join("node"))
        .args([
            "--name",
            "mps",
            "--sim-gpus",
            "1xRTX4090",
            "--executor",
            "sim",
        ])
        .args(["--mps", "--join-token", "gpj_x"])
        .env("PATH", path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut agent = KillOnDrop(child);
    let mut status = None;
    for _ in 0..300 {
        status = agent.0.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (status, std::fs::read_to_string(&log).unwrap())
}

fn fake_control(dir: &Path, script: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let program = bin.join("nvidia-cuda-mps-control");
    std::fs::write(&program, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn an_agent_with_mps_refuses_to_start_when_the_daemon_hangs_or_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let hangs = fake_control(dir.path(), "exec sleep 60");
    let (status, log) = agent_with_mps(dir.path(), &hangs);
    assert!(status.is_some_and(|s| !s.success()), "{status:?}\n{log}");
    assert!(
        log.contains("did not answer `get_server_list` within 2 s")
            && log.contains("nvidia-cuda-mps-control -d"),
        "{log}"
    );
    let empty = tempfile::tempdir().unwrap();
    let (status, log) = agent_with_mps(dir.path(), empty.path());
    assert!(status.is_some_and(|s| !s.success()), "{status:?}\n{log}");
    assert!(
        log.contains("nvidia-cuda-mps-control is not on PATH"),
        "{log}"
    );
}

#[test]
fn an_agent_with_mps_starts_when_the_daemon_answers() {
    let dir = tempfile::tempdir().unwrap();
    let answers = fake_control(dir.path(), "cat > /dev/null");
    let (status, log) = agent_with_mps(dir.path(), &answers);
    // Past the check it goes on to register (with a control plane that is not there): it
    // fails then for that reason, not for MPS.
    assert!(
        log.contains("the MPS control daemon answers"),
        "{status:?}\n{log}"
    );
    assert!(!log.contains("--mps:"), "{log}");
}
