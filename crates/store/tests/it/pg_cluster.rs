//! Throwaway PostgreSQL clusters of the test's own (a primary and a streaming standby on
//! loopback ports), for the failover tests; each is stopped and removed on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The directory holding `initdb`, `pg_ctl` and `pg_basebackup` (Debian's layout, highest
/// version first, else `PATH`).
fn pg_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.into_iter()
        .rev()
        .find(|d| d.join("pg_ctl").exists())
        .unwrap_or_default()
}

fn is_root() -> bool {
    // The server refuses to run as root: then it runs as `postgres`.
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs a PostgreSQL tool as the user the server may run as; panics with its output if it fails.
fn pg(tool: &str, args: &[&str]) {
    let path = pg_bin().join(tool);
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&path);
        c
    } else {
        Command::new(&path)
    };
    let out = cmd
        .args(args)
        .current_dir("/")
        .output()
        .unwrap_or_else(|e| panic!("{tool} did not run ({}): {e}", path.display()));
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One cluster, started; stopped (immediately) and removed on drop.
pub struct Cluster {
    pub port: u16,
    dir: tempfile::TempDir,
    running: bool,
}

impl Cluster {
    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn prepare_dir() -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix("gpurent-pg-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:", &dir.path().display().to_string()])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "chown of the cluster directory to postgres failed");
        }
        dir
    }

    fn configure(dir: &Path, port: u16) {
        let conf = dir.join("data/postgresql.conf");
        let extra = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             fsync = off\nfull_page_writes = off\nwal_level = replica\nmax_wal_senders = 4\n",
            dir.display()
        );
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        text.push_str(&extra);
        std::fs::write(&conf, text).expect("write postgresql.conf");
    }

    fn start(&mut self) {
        let log = self.dir.path().join("server.log").display().to_string();
        pg(
            "pg_ctl",
            &["start", "-D", &self.data(), "-l", &log, "-w", "-t", "60"],
        );
        self.running = true;
    }

    /// A new primary with database `gpurent`, user `gpurent`, trust auth on loopback.
    pub async fn primary() -> Cluster {
        let dir = Self::prepare_dir();
        let data = dir.path().join("data").display().to_string();
        pg(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "gpurent",
                "--auth=trust",
                "--no-sync",
                "--locale=C",
            ],
        );
        let cluster = Self::started(dir);
        let mut conn = cluster.connect("postgres").await;
        sqlx::query("CREATE DATABASE gpurent")
            .execute(&mut conn)
            .await
            .expect("create database");
        cluster
    }

    /// A cluster on a free port over the data prepared in `dir`, configured and started.
    fn started(dir: tempfile::TempDir) -> Cluster {
        let port = free_port();
        Self::configure(dir.path(), port);
        let mut cluster = Cluster {
            port,
            dir,
            running: false,
        };
        cluster.start();
        cluster
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`), started.
    pub fn standby_of(primary: &Cluster) -> Cluster {
        let dir = Self::prepare_dir();
        let data = dir.path().join("data").display().to_string();
        pg(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "gpurent",
                "-D",
                &data,
                "-R",
                "-X",
                "stream",
                // An immediate checkpoint: a spread one waits minutes on an idle primary.
                "-c",
                "fast",
            ],
        );
        Self::started(dir)
    }

    pub async fn connect(&self, db: &str) -> sqlx::PgConnection {
        use sqlx::Connection;
        let url = format!("postgres://gpurent@127.0.0.1:{}/{db}", self.port);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match sqlx::PgConnection::connect(&url).await {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => panic!("connect to {url}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// `pg_ctl promote`: the standby takes writes.
    pub fn promote(&self) {
        pg("pg_ctl", &["promote", "-D", &self.data(), "-w", "-t", "60"]);
    }

    /// `pg_ctl stop -m immediate`: as a crash.
    pub fn kill(&mut self) {
        if self.running {
            pg(
                "pg_ctl",
                &[
                    "stop",
                    "-D",
                    &self.data(),
                    "-m",
                    "immediate",
                    "-w",
                    "-t",
                    "60",
                ],
            );
            self.running = false;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            let path = pg_bin().join("pg_ctl");
            let data = self.data();
            let mut cmd = if is_root() {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&path);
                c
            } else {
                Command::new(&path)
            };
            let _ = cmd
                .args(["stop", "-D", &data, "-m", "immediate", "-w", "-t", "30"])
                .current_dir("/")
                .output();
        }
    }
}
