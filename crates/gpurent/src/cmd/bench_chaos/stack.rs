//! The HA stack a chaos run works on: `scripts/ha-up.sh` (built into the binary with the deploy
//! files it reads) on free loopback ports in a directory of its own, its daemons found by their
//! pid files, and `scripts/ha-down.sh --purge` when the run ends, whatever happened.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use sqlx::Connection;

/// The scripts and the deploy files they read, as this binary was built with them.
const KIT: [(&str, &str); 4] = [
    (
        "scripts/ha-up.sh",
        include_str!("../../../../../scripts/ha-up.sh"),
    ),
    (
        "scripts/ha-down.sh",
        include_str!("../../../../../scripts/ha-down.sh"),
    ),
    (
        "deploy/ha/haproxy.cfg.in",
        include_str!("../../../../../deploy/ha/haproxy.cfg.in"),
    ),
    (
        "deploy/ha/monitor.sql",
        include_str!("../../../../../deploy/ha/monitor.sql"),
    ),
];

/// The replicas, numbered as ha-up.sh names them (`replica-1` ...).
pub const REPLICAS: u8 = 3;

/// One HA stack: HAProxy on `port`, replica n on `port + n`; pg_auto_failover's monitor on
/// `pg_port`, PostgreSQL node k on `pg_port + k`.
#[derive(Debug)]
pub struct Stack {
    dir: PathBuf,
    pub port: u16,
    pub pg_port: u16,
    /// `GPURENT_HA_REPLICA_DB_URL_n` for each replica (through the run's proxies).
    replica_db_urls: Vec<String>,
    missed_heartbeats: u32,
    /// The gpurent binary ha-up.sh starts replicas with; this one's when unset.
    bin: Option<PathBuf>,
    /// Leave the directory (its logs) when brought down: the run failed.
    keep: bool,
}

impl Stack {
    /// A stack to be brought up in a new directory under the system's temp dir, on free
    /// ports; nothing runs yet.
    pub fn new(missed_heartbeats: u32) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("gpurent-chaos-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        for (path, text) in KIT {
            let to = dir.join("kit").join(path);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&to, text).with_context(|| format!("write {}", to.display()))?;
        }
        Ok(Stack {
            dir,
            port: free_base(21_180, 5)?,
            pg_port: free_base(25_540, 3)?,
            replica_db_urls: Vec::new(),
            missed_heartbeats,
            bin: None,
            keep: false,
        })
    }

    /// The binary replicas are started with from now on (another release's, for an upgrade).
    pub fn set_bin(&mut self, bin: Option<PathBuf>) {
        self.bin = bin;
    }

    /// The PostgreSQL node k's port (k = 1, 2).
    pub fn pg_node_port(&self, k: u8) -> u16 {
        self.pg_port + u16::from(k)
    }

    /// Replica n's database URL (`host:port` pairs of the proxies it goes through).
    pub fn set_replica_db_urls(&mut self, urls: Vec<String>) {
        self.replica_db_urls = urls;
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn replica_url(&self, n: u8) -> String {
        format!("http://127.0.0.1:{}", self.port + u16::from(n))
    }

    /// The stack's first start (`on`: which release, for the message), said on stderr before
    /// and after; the seconds it took.
    pub async fn first_up(&self, on: &str) -> anyhow::Result<f64> {
        eprintln!(
            "bench: bringing the HA stack up{on} in {} (ha-up.sh; about 2 minutes)",
            self.dir().display()
        );
        let started = Instant::now();
        self.up().await?;
        let took = started.elapsed().as_secs_f64();
        eprintln!("bench: the stack is up after {took:.0} s: {}", self.url());
        Ok(took)
    }

    /// Runs ha-up.sh: everything that does not run is started and waited for (the first time
    /// all of it; after a fault what the fault killed). Its output goes to `ha-up.log`.
    pub async fn up(&self) -> anyhow::Result<()> {
        let log_path = self.dir.join("ha-up.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg(self.dir.join("kit/scripts/ha-up.sh"));
        self.env(&mut cmd);
        let status = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .status()
            .await
            .context("run ha-up.sh")?;
        if !status.success() {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = said.lines().rev().take(15).collect();
            for line in tail.into_iter().rev() {
                eprintln!("  {line}");
            }
            bail!("ha-up.sh failed ({status}; the end of its output above)");
        }
        Ok(())
    }

    fn env(&self, cmd: &mut tokio::process::Command) {
        cmd.env("GPURENT_HA_DIR", self.dir.join("ha"))
            .env("GPURENT_HA_PORT", self.port.to_string())
            .env("GPURENT_HA_PG_PORT", self.pg_port.to_string())
            .env(
                "GPURENT_HA_MISSED_HEARTBEATS",
                self.missed_heartbeats.to_string(),
            )
            .env_remove("GPURENT_HA_SIM_AGENT");
        if let Some(bin) = self.bin.clone().or_else(|| std::env::current_exe().ok()) {
            cmd.env("GPURENT_BIN", bin);
        }
        for (i, url) in self.replica_db_urls.iter().enumerate() {
            cmd.env(format!("GPURENT_HA_REPLICA_DB_URL_{}", i + 1), url);
        }
    }

    /// The admin token the first replica wrote.
    pub fn admin_token(&self) -> anyhow::Result<String> {
        let path = self.dir.join("ha/replicas/r1/admin.token");
        Ok(std::fs::read_to_string(&path)
            .with_context(|| format!("read {}", path.display()))?
            .trim()
            .to_owned())
    }

    /// The pid in `run/NAME.pid` (each daemon leads a session of its own).
    pub fn pid(&self, name: &str) -> anyhow::Result<Pid> {
        let path = self.dir.join(format!("ha/run/{name}.pid"));
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        Ok(Pid::from_raw(text.trim().parse().with_context(|| {
            format!("{}: not a pid", path.display())
        })?))
    }

    /// kill -9 of replica n.
    pub fn kill_replica(&self, n: u8) -> anyhow::Result<()> {
        kill(self.pid(&format!("replica-{n}"))?, Signal::SIGKILL)
            .with_context(|| format!("kill replica {n}"))
    }

    /// SIGTERM of replica n, as a service manager stops it, and its end waited for (at most
    /// `within`, then kill -9); whether it ended on its own.
    pub async fn stop_replica(&self, n: u8, within: Duration) -> anyhow::Result<bool> {
        let pid = self.pid(&format!("replica-{n}"))?;
        kill(pid, Signal::SIGTERM).with_context(|| format!("SIGTERM replica {n}"))?;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if kill(pid, None).is_err() {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = kill(pid, Signal::SIGKILL);
        Ok(false)
    }

    /// The binary replica n runs.
    pub fn replica_exe(&self, n: u8) -> anyhow::Result<PathBuf> {
        let pid = self.pid(&format!("replica-{n}"))?;
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("replica {n}'s binary"))
    }

    /// Waits until HAProxy's own checks have put replica n back in rotation (`UP` in its
    /// stats), at most `within`.
    pub async fn balanced(&self, n: u8, within: Duration) -> bool {
        let http = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/stats;csv", self.port + 4);
        let name = format!("r{n}");
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let csv = match http.get(&url).timeout(Duration::from_secs(2)).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if server_status(&csv, "replicas", &name).is_some_and(|s| s == "UP") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }

    /// SIGSTOP (or SIGCONT) of replica n.
    pub fn pause_replica(&self, n: u8, paused: bool) -> anyhow::Result<()> {
        let signal = if paused {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        kill(self.pid(&format!("replica-{n}"))?, signal)
            .with_context(|| format!("{signal} replica {n}"))
    }

    /// The PostgreSQL node (1 or 2) that takes writes now, if one does.
    pub async fn primary(&self) -> Option<u8> {
        for k in [1, 2] {
            if self.takes_writes(k).await {
                return Some(k);
            }
        }
        None
    }

    /// Whether PostgreSQL node k answers and takes writes.
    pub async fn takes_writes(&self, k: u8) -> bool {
        writable(self.pg_node_port(k)).await
    }

    /// Whether pg_auto_failover's monitor has a primary and a secondary, each in the state it
    /// was assigned (a rejoining node has caught up).
    pub async fn pair_healthy(&self) -> bool {
        let url = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.pg_port
        );
        let check = async {
            let mut conn = sqlx::postgres::PgConnection::connect(&url).await.ok()?;
            let settled: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pgautofailover.node \
                 WHERE reportedstate = goalstate \
                   AND reportedstate::text IN ('primary', 'secondary')",
            )
            .fetch_one(&mut conn)
            .await
            .ok()?;
            let _ = conn.close().await;
            Some(settled == 2)
        };
        tokio::time::timeout(Duration::from_secs(2), check)
            .await
            .ok()
            .flatten()
            .unwrap_or(false)
    }

    /// kill -9 of PostgreSQL node k as a machine's death: its keeper (pg_autoctl, with
    /// everything in its session) and its postmaster.
    pub fn kill_pg_node(&self, k: u8) -> anyhow::Result<()> {
        let keeper = self.pid(&format!("pg-node{k}"))?;
        let postmaster =
            std::fs::read_to_string(self.dir.join(format!("ha/pg/node{k}/postmaster.pid")))
                .ok()
                .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()));
        killpg(keeper, Signal::SIGKILL)
            .or_else(|_| kill(keeper, Signal::SIGKILL))
            .with_context(|| format!("kill PostgreSQL node {k}'s keeper"))?;
        if let Some(pid) = postmaster {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        Ok(())
    }

    /// Waits until replica n answers ready (200 on /readyz), at most `within`.
    pub async fn replica_ready(&self, n: u8, within: Duration) -> bool {
        let http = reqwest::Client::new();
        let url = format!("{}/readyz", self.replica_url(n));
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let ok = http
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }

    /// When brought down, leave the directory and its logs (for a run that failed).
    pub fn keep_logs(&mut self) {
        self.keep = true;
    }

    /// Everything ha-up.sh started, stopped, and the directory removed (unless kept).
    pub fn down(&self) {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(self.dir.join("kit/scripts/ha-down.sh"));
        if !self.keep {
            cmd.arg("--purge");
        }
        cmd.env("GPURENT_HA_DIR", self.dir.join("ha"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = cmd.status();
        if self.keep {
            eprintln!(
                "bench: the stack is down; its logs are kept in {}",
                self.dir.join("ha/logs").display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.down();
    }
}

/// Whether PostgreSQL on `port` answers and is not a standby.
async fn writable(port: u16) -> bool {
    let url = format!("postgres://postgres@127.0.0.1:{port}/gpurent?sslmode=disable");
    let check = async {
        let mut conn = sqlx::postgres::PgConnection::connect(&url).await.ok()?;
        let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        let _ = conn.close().await;
        Some(!standby)
    };
    tokio::time::timeout(Duration::from_secs(2), check)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// A server's status in HAProxy's CSV stats (`# pxname,svname,...,status,...`).
fn server_status(csv: &str, backend: &str, server: &str) -> Option<String> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
    let status = header.iter().position(|h| *h == "status")?;
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&backend) && f.get(1) == Some(&server))
        .and_then(|f| f.get(status).map(|s| (*s).to_owned()))
}

/// A port from which `count` ports in a row are free on loopback.
fn free_base(from: u16, count: u16) -> anyhow::Result<u16> {
    (0..300)
        .map(|i| from + i * 10)
        .find(|&base| {
            (base..base + count).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .context("no free loopback ports for the HA stack")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_status_is_read_from_haproxy_csv() {
        let csv = "# pxname,svname,qcur,status,weight\n\
                   gpurent,FRONTEND,0,OPEN,\n\
                   replicas,r1,0,UP,1\n\
                   replicas,r2,0,DOWN,1\n";
        assert_eq!(server_status(csv, "replicas", "r1").as_deref(), Some("UP"));
        assert_eq!(
            server_status(csv, "replicas", "r2").as_deref(),
            Some("DOWN")
        );
        assert_eq!(server_status(csv, "replicas", "r3"), None);
        assert_eq!(server_status("", "replicas", "r1"), None);
    }
}
