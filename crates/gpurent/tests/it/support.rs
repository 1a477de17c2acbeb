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
        Daemon::start_in(Path::new("."), args, log)
    }

    /// `gpurent server` on a fresh SQLite data dir `data`, on a free loopback port.
    pub fn server(data: &Path, log: &Path) -> Daemon {
        let data = data.to_str().expect("a UTF-8 path");
        Daemon::start(
            &["server", "--data-dir", data, "--listen", "127.0.0.1:0"],
            log,
        )
    }

    /// `gpurent up` on a fresh SQLite data dir `data` with the simulated GPUs `gpus` and the sim
    /// executor (nothing runs), on a free loopback port, with `extra` flags.
    pub fn up_sim(data: &Path, gpus: &str, extra: &[&str], log: &Path) -> Daemon {
        let data = data.to_str().expect("a UTF-8 path");
        let mut args = vec![
            "up",
            "--data-dir",
            data,
            "--listen",
            "127.0.0.1:0",
            "--sim-gpus",
            gpus,
            "--executor",
            "sim",
        ];
        args.extend_from_slice(extra);
        Daemon::start(&args, log)
    }

    /// `start` in the working directory `cwd` (relative paths, `./gpurent-data`, are there).
    pub fn start_in(cwd: &Path, args: &[&str], log: &Path) -> Daemon {
        Daemon::start_in_env(cwd, args, &[], log)
    }

    /// `start_in` with more environment variables (`DOCKER_HOST`, say).
    pub fn start_in_env(cwd: &Path, args: &[&str], env: &[(&str, &str)], log: &Path) -> Daemon {
        let log = std::fs::File::create(log).expect("log file");
        // `up` serves SSH on a fixed port by default: tests run many `up`s at once, so only
        // those that ask for SSH (with --ssh-listen, port 0) get it.
        let mut args = args.to_vec();
        if args.first() == Some(&"up") && !args.contains(&"--ssh-listen") {
            args.extend(["--ssh-listen", "off"]);
        }
        let mut command = Command::new(BIN);
        command
            .current_dir(cwd)
            .args(&args)
            .envs(env.iter().copied());
        Daemon::spawn(command, log)
    }

    /// Starts `command` (a `gpurent` daemon, perhaps run by another program: chroot, say),
    /// its stderr to `log`, and waits for its `gpurent ready: URL` line.
    pub fn spawn(mut command: Command, log: std::fs::File) -> Daemon {
        let mut child = command
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
        Daemon::start_quiet_with(BIN, args, log)
    }

    /// Starts `PROGRAM ARGS` (e.g. `gpurent` run by another program) printing no ready line.
    pub fn start_quiet_with(program: &str, args: &[&str], log: &Path) -> Daemon {
        Daemon::start_quiet_env(program, args, &[], log)
    }

    /// `start_quiet_with` with more environment variables (`DOCKER_HOST`, say).
    pub fn start_quiet_env(
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Daemon {
        let log = std::fs::File::create(log).expect("log file");
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
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
    cli_with(url, &[], token, json, args)
}

/// `cli` with more global flags (`--tls-fingerprint HEX`, say).
pub fn cli_with(
    url: &str,
    global: &[String],
    token: Option<&str>,
    json: bool,
    args: &[&str],
) -> Run {
    cli_of(BIN, url, global, token, json, args)
}

/// `cli_with` run by another `gpurent` binary (the previous release's, say).
pub fn cli_of(
    program: &str,
    url: &str,
    global: &[String],
    token: Option<&str>,
    json: bool,
    args: &[&str],
) -> Run {
    let mut cmd = Command::new(program);
    cmd.args(["--server", url])
        .args(global)
        .env_remove("GPURENT_CA_CERT")
        .env_remove("GPURENT_TLS_FINGERPRINT")
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

/// A control plane (`gpurent server`) in a temporary directory, with its admin token, and the
/// arguments of agents that join it with the process executor.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub url: String,
    pub admin: String,
    /// Global flags of every command: how clients trust an https:// control plane.
    pub tls: Vec<String>,
    _server: Daemon,
}

impl Drop for Cluster {
    /// Agents killed with SIGKILL leave their process executor's instances running (a restarted
    /// agent would adopt them): kill every process group whose command names this cluster's
    /// directory (the instance wrappers do), so no workload outlives its test; then unmount
    /// the volumes and instance disks its agents mounted there.
    fn drop(&mut self) {
        gpurent_agent::testing::kill_processes_naming(self.dir.path());
        gpurent_agent::testing::unmount_under(self.dir.path());
    }
}

impl Cluster {
    pub fn start(listen: &str) -> Cluster {
        Cluster::start_with(listen, &[])
    }

    /// A control plane with TLS (`--tls-self-signed`): clients pin its certificate.
    pub fn start_tls(listen: &str) -> Cluster {
        let mut cluster = Cluster::start_with(listen, &["--tls-self-signed"]);
        let fingerprint =
            std::fs::read_to_string(cluster.dir.path().join("data/tls.fingerprint")).unwrap();
        cluster.tls = vec!["--tls-fingerprint".into(), fingerprint.trim().to_owned()];
        cluster
    }

    /// A control plane started with `extra` flags.
    pub fn start_with(listen: &str, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let args = [
            &[
                "server",
                "--data-dir",
                data.to_str().unwrap(),
                "--listen",
                listen,
            ][..],
            extra,
        ]
        .concat();
        let server = Daemon::start(&args, &dir.path().join("server.log"));
        Cluster {
            url: server.url.clone(),
            admin: read_token(&data),
            tls: Vec::new(),
            dir,
            _server: server,
        }
    }

    /// `gpurent` as `token`, with the cluster's TLS flags.
    pub fn cli(&self, token: Option<&str>, json: bool, args: &[&str]) -> Run {
        cli_with(&self.url, &self.tls, token, json, args)
    }

    /// `gpurent ... agent` joining as NAME, with one simulated RTX 4090, the process executor
    /// (unisolated, not in the machine's cgroup tree: these tests are about nodes, not limits
    /// or isolation) and `extra`.
    pub fn agent_args(&self, name: &str, extra: &[&str]) -> Vec<String> {
        self.agent_args_on(name, &["--sim-gpus", "1xRTX4090"], extra)
    }

    /// `agent_args` with these GPU flags (`--fake-nvml FILE`, say) instead of one simulated
    /// RTX 4090.
    pub fn agent_args_on(&self, name: &str, gpus: &[&str], extra: &[&str]) -> Vec<String> {
        let join = self
            .cli(Some(&self.admin), true, &["nodes", "join-token"])
            .json();
        let data = self.dir.path().join(name);
        let mut args: Vec<String> = self.tls.clone();
        args.extend(
            [
                "--server",
                self.url.as_str(),
                "agent",
                "--data-dir",
                data.to_str().unwrap(),
                "--name",
                name,
            ]
            .map(str::to_owned),
        );
        args.extend(gpus.iter().map(|a| (*a).to_owned()));
        args.extend(
            [
                "--executor",
                "process",
                "--cgroup-root",
                "/nonexistent/gpurent",
                "--allow-unisolated",
                "--join-token",
                join["token"].as_str().unwrap(),
            ]
            .map(str::to_owned),
        );
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    }

    /// Starts `gpurent` with `args` (from `agent_args`), its log in the directory.
    pub fn agent(&self, name: &str, args: &[String]) -> Daemon {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Daemon::start_quiet(&args, &self.dir.path().join(format!("{name}.log")))
    }

    /// The nodes as `gpurent nodes ls` shows them.
    pub fn nodes(&self) -> Vec<Value> {
        let nodes = self.cli(Some(&self.admin), true, &["nodes", "ls"]).json();
        nodes.as_array().cloned().unwrap_or_default()
    }

    pub fn node_status(&self, name: &str) -> Option<String> {
        self.nodes()
            .iter()
            .find(|n| n["name"] == name)
            .and_then(|n| n["status"].as_str().map(str::to_owned))
    }

    pub fn wait_ready(&self, count: usize) {
        eventually(&format!("{count} nodes ready"), 60, || {
            let nodes = self.nodes();
            nodes.len() == count && nodes.iter().all(|n| n["status"] == "ready")
        });
    }

    /// A tenant with 50 of credit; its token.
    pub fn tenant(&self, name: &str) -> String {
        let args = ["users", "create", name, "--credit", "50"];
        let tenant = self.cli(Some(&self.admin), true, &args).json();
        tenant["token"].as_str().unwrap().to_owned()
    }

    /// `gpurent reserve` as the tenant; the reservation's id.
    pub fn reserve(&self, token: &str, args: &[&str]) -> String {
        let r = self.cli(Some(token), true, &[&["reserve"], args].concat());
        assert_eq!(r.code, 0, "{r:?}");
        r.json()["id"].as_str().unwrap().to_owned()
    }

    pub fn get(&self, token: &str, id: &str) -> Value {
        self.cli(Some(token), true, &["get", id]).json()
    }

    pub fn ledger_check(&self) {
        let check = self.cli(Some(&self.admin), true, &["admin", "ledger-check"]);
        assert_eq!(check.code, 0, "{check:?}");
    }
}

/// The process group of a reservation's instance, from the process executor's own record in
/// the node's data dir (written just after the instance starts: waited for).
pub fn instance_pgid(node_dir: &Path, reservation_id: &str) -> i64 {
    let file = node_dir
        .join("instances")
        .join(reservation_id)
        .join("instance.json");
    let mut pgid = None;
    eventually("the instance's record", 10, || {
        pgid = std::fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .and_then(|v| v["pgid"].as_i64());
        pgid.is_some()
    });
    pgid.unwrap_or_default()
}
