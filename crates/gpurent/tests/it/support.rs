//! Running `gpurent` processes: daemons that print a ready line, and CLI commands.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_gpurent");

/// A daemon (`up`, `server`, `agent`) killed with SIGKILL when dropped.
pub struct Daemon {
    pub child: Child,
    pub url: String,
}

impl Daemon {
    /// Starts `gpurent ARGS` and waits for its `gpurent ready: URL` line.
    pub fn start(args: &[&str], log: &Path) -> Daemon {
        let log = std::fs::File::create(log).expect("log file");
        let mut child = Command::new(BIN)
            .args(args)
            .env("GPURENT_LOG", "info,sqlx=warn")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn gpurent");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("no ready line within 60 s");
        let url = line
            .strip_prefix("gpurent ready: ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Daemon {
            child,
            url: url.to_owned(),
        }
    }

    /// Starts a daemon that prints no ready line (the agent).
    pub fn start_quiet(args: &[&str], log: &Path) -> Daemon {
        let log = std::fs::File::create(log).expect("log file");
        let child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn");
        Daemon {
            child,
            url: String::new(),
        }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..200 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("gpurent did not exit within 10 s of SIGTERM");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The result of one CLI command.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// stdout as the one JSON document `--json` promises.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON document ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs `gpurent --server URL [--json] ARGS` with a token.
pub fn cli(url: &str, token: Option<&str>, json: bool, args: &[&str]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(["--server", url])
        .env_remove("GPURENT_TOKEN")
        .env("GPURENT_DATA_DIR", "/nonexistent");
    if json {
        cmd.arg("--json");
    }
    if let Some(token) = token {
        cmd.args(["--token", token]);
    }
    let out = cmd.args(args).output().expect("run gpurent");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn read_token(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("admin.token"))
        .expect("admin.token")
        .trim()
        .to_owned()
}

/// Polls `check` every 50 ms for up to `secs` seconds.
pub fn eventually(what: &str, secs: u64, mut check: impl FnMut() -> bool) {
    for _ in 0..secs * 20 {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}
