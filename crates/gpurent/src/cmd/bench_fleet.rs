//! `gpurent bench fleet`: what a fleet's syncs cost the control plane. The control plane is a
//! child process (`gpurent server`, so that its CPU and memory are its own, read from /proc);
//! the nodes are simulated agents in this process (`bench_fleet_agent`), syncing over HTTP
//! with telemetry at the default heartbeat while reservations arrive through the API.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_store::SqlStore;
use serde::Serialize;
use tokio::io::AsyncBufReadExt;
use tokio::sync::{watch, Semaphore};

use super::bench_common::{cpu_seconds, percentile_ms, rss_mib, JOIN_TOKEN, TENANT_TOKEN};
use super::bench_fleet_agent::{self as agent, AgentStats, Fleet, HEARTBEAT};
use crate::cli::BenchFleetArgs;
use crate::output::{print_json, print_table};

/// Registrations at a time (a fleet coming up, not all at once).
const REGISTER_CONCURRENCY: usize = 64;

#[derive(Debug, Serialize)]
struct FleetResult {
    backend: String,
    nodes: u32,
    gpus: u32,
    seconds: f64,
    syncs: u64,
    syncs_per_sec: f64,
    /// Control-plane time per sync, the long poll's hold left out (see `AgentStats`).
    sync_p50_ms: f64,
    sync_p99_ms: f64,
    sync_max_ms: f64,
    /// Syncs answered early by a change of desired state (no latency sample).
    woken_syncs: u64,
    errors: u64,
    first_error: Option<String>,
    reservations_created: u64,
    reservation_errors: u64,
    /// Reservations whose node's agent got them (and reported them running).
    reservations_placed: u64,
    /// Running when the run ended, as the API lists them.
    reservations_running: u64,
    /// From a reservation's creation to its agent's answer naming it.
    placement_p50_ms: f64,
    placement_p99_ms: f64,
    control_plane_cpu_percent: f64,
    control_plane_rss_mib: f64,
    /// The control plane's CPU time per sync answered (all its work counted), which a busy
    /// machine changes less than latency.
    control_plane_cpu_ms_per_sync: f64,
    /// Of the time the control plane's threads were ready to run, the share they waited for a
    /// CPU (/proc/PID/task/*/schedstat): high on a machine busy with other work, whose
    /// latencies then say little about the control plane.
    control_plane_cpu_wait_percent: f64,
    /// PostgreSQL's backends serving the control plane (none on SQLite).
    database_cpu_percent: Option<f64>,
    database_cpu_ms_per_sync: Option<f64>,
    /// This process: the simulated agents and the reservations' client.
    agents_cpu_percent: f64,
    registration_secs: f64,
}

pub async fn run(args: BenchFleetArgs, json: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let result = measure(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    let database = match (result.database_cpu_percent, result.database_cpu_ms_per_sync) {
        (Some(c), Some(ms)) => format!("{c:.0} ({ms:.2} ms/sync)"),
        _ => "-".to_owned(),
    };
    print_table(
        &[
            "backend",
            "nodes",
            "GPUs",
            "syncs/s",
            "sync p50 ms",
            "sync p99 ms",
            "errors",
            "placed",
            "server CPU %",
            "server CPU ms/sync",
            "server RSS MiB",
            "server CPU wait %",
            "database CPU %",
            "agents CPU %",
        ],
        &[vec![
            result.backend.clone(),
            result.nodes.to_string(),
            result.gpus.to_string(),
            format!("{:.0}", result.syncs_per_sec),
            format!("{:.1}", result.sync_p50_ms),
            format!("{:.1}", result.sync_p99_ms),
            result.errors.to_string(),
            result.reservations_placed.to_string(),
            format!("{:.0}", result.control_plane_cpu_percent),
            format!("{:.2}", result.control_plane_cpu_ms_per_sync),
            format!("{:.0}", result.control_plane_rss_mib),
            format!("{:.0}", result.control_plane_cpu_wait_percent),
            database,
            format!("{:.0}", result.agents_cpu_percent),
        ]],
    );
    if let Some(e) = &result.first_error {
        eprintln!("bench: first error: {e}");
    }
    Ok(())
}

async fn measure(args: &BenchFleetArgs, dir: &std::path::Path) -> anyhow::Result<FleetResult> {
    anyhow::ensure!(args.nodes > 0, "--nodes must be at least 1");
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}/fleet.db", dir.display()),
    };
    let backend = if url.starts_with("sqlite") {
        "sqlite"
    } else {
        "postgres"
    };
    seed(&url).await?;
    let mut server = ControlPlane::start(&url, dir).await?;
    let fleet = Arc::new(Fleet {
        // One pool for every agent: each keeps its own connection alive between syncs.
        http: reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .build()?,
        base: server.url.clone(),
        join_token: JOIN_TOKEN.to_owned(),
        gpus_per_node: args.gpus_per_node,
        measuring: AtomicBool::new(false),
        posted: Mutex::new(HashMap::new()),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });

    eprintln!(
        "bench: registering {} nodes x {} GPUs against {backend}",
        args.nodes, args.gpus_per_node
    );
    let (stop, stopped) = watch::channel(false);
    let registered_at = Instant::now();
    let gate = Arc::new(Semaphore::new(REGISTER_CONCURRENCY));
    let mut registrations = tokio::task::JoinSet::new();
    for n in 0..args.nodes {
        let (fleet, gate) = (fleet.clone(), gate.clone());
        registrations.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            anyhow::Ok((n, agent::register(&fleet, n).await?))
        });
    }
    let mut agents = Vec::new();
    while let Some(done) = registrations.join_next().await {
        let (n, auth) = done??;
        // Each agent syncs as soon as it registered, its first sync spread over a heartbeat.
        let delay = HEARTBEAT.mul_f64(f64::from(n % 997) / 997.0);
        agents.push(tokio::spawn(agent::run(
            fleet.clone(),
            n,
            auth,
            delay,
            stopped.clone(),
        )));
    }
    let registration_secs = registered_at.elapsed().as_secs_f64();
    // Two heartbeats for every node's first syncs (inventory and host facts) to pass.
    tokio::time::sleep(HEARTBEAT * 2).await;
    let errors_before = fleet.errors.load(Ordering::Relaxed);
    eprintln!(
        "bench: {} nodes registered in {registration_secs:.1} s; measuring {} s with {} reservations/s",
        args.nodes, args.duration_secs, args.reservations_per_sec
    );

    let reserving = tokio::spawn(reserve(
        fleet.clone(),
        args.reservations_per_sec,
        stopped.clone(),
    ));
    let database = Database::of(&url);
    let sched0 = schedstat(server.pid);
    let (cp0, me0, db0) = (
        cpu_seconds(&format!("/proc/{}/stat", server.pid)),
        cpu_seconds("/proc/self/stat"),
        database.cpu_seconds(),
    );
    let t0 = Instant::now();
    fleet.measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(args.duration_secs)).await;
    fleet.measuring.store(false, Ordering::Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    let sched1 = schedstat(server.pid);
    let (cp1, me1, db1) = (
        cpu_seconds(&format!("/proc/{}/stat", server.pid)),
        cpu_seconds("/proc/self/stat"),
        database.cpu_seconds(),
    );
    let rss = rss_mib(server.pid);
    let _ = stop.send(true);
    let (created, reservation_errors) = reserving.await??;
    let errors = fleet.errors.load(Ordering::Relaxed) - errors_before;
    let running = running_reservations(&fleet).await?;
    let mut total = AgentStats::default();
    for a in agents {
        let s = a.await?;
        total.syncs += s.syncs;
        total.woken += s.woken;
        total.latencies.extend(s.latencies);
        total.placements.extend(s.placements);
    }
    server.stop().await;
    total.latencies.sort();
    total.placements.sort();
    let percent = |a: f64, b: f64| 100.0 * (b - a) / seconds;
    #[allow(clippy::cast_precision_loss)]
    let per_sync = |a: f64, b: f64| 1000.0 * (b - a) / (total.syncs.max(1) as f64);
    #[allow(clippy::cast_precision_loss)]
    let syncs_per_sec = total.syncs as f64 / seconds;
    let first_error = fleet
        .first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok(FleetResult {
        backend: backend.to_owned(),
        nodes: args.nodes,
        gpus: args.nodes * args.gpus_per_node,
        seconds,
        syncs: total.syncs,
        syncs_per_sec,
        sync_p50_ms: percentile_ms(&total.latencies, 0.50),
        sync_p99_ms: percentile_ms(&total.latencies, 0.99),
        sync_max_ms: percentile_ms(&total.latencies, 1.0),
        woken_syncs: total.woken,
        errors,
        first_error,
        reservations_created: created,
        reservation_errors,
        reservations_placed: total.placements.len() as u64,
        reservations_running: running,
        placement_p50_ms: percentile_ms(&total.placements, 0.50),
        placement_p99_ms: percentile_ms(&total.placements, 0.99),
        control_plane_cpu_percent: percent(cp0, cp1),
        control_plane_rss_mib: rss,
        control_plane_cpu_ms_per_sync: per_sync(cp0, cp1),
        control_plane_cpu_wait_percent: {
            let (ran, waited) = (sched1.0 - sched0.0, sched1.1 - sched0.1);
            100.0 * waited / (ran + waited).max(f64::MIN_POSITIVE)
        },
        database_cpu_percent: match (db0, db1) {
            (Some(a), Some(b)) => Some(percent(a, b)),
            _ => None,
        },
        database_cpu_ms_per_sync: match (db0, db1) {
            (Some(a), Some(b)) => Some(per_sync(a, b)),
            _ => None,
        },
        agents_cpu_percent: percent(me0, me1),
        registration_secs,
    })
}

/// The store's admin, the join token of the fleet and the tenant that reserves (the store must
/// be empty).
async fn seed(url: &str) -> anyhow::Result<()> {
    let store = SqlStore::connect(url)
        .await
        .context("open the store of --database-url")?;
    super::bench_common::admin_and_join_token(&store, chrono::Duration::days(1)).await?;
    super::bench_common::bench_tenant(&store, 1_000_000_000)
        .await
        .context("create the bench tenant (the database must be empty)")?;
    store.close().await;
    Ok(())
}

/// Posts reservations of one GPU at `per_sec` until `stop`: how many were created, and how
/// many refused.
async fn reserve(
    fleet: Arc<Fleet>,
    per_sec: f64,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<(u64, u64)> {
    let (mut created, mut refused) = (0, 0);
    if per_sec <= 0.0 {
        return Ok((0, 0));
    }
    let url = format!("{}/api/v1/reservations", fleet.base);
    let body = serde_json::to_vec(&serde_json::json!({"gpu_type": "rtx4090", "hours": 1}))?;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let at = Instant::now();
        let answer = fleet
            .http
            .post(&url)
            .bearer_auth(TENANT_TOKEN)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        match answer {
            Ok(r) if r.status() == reqwest::StatusCode::CREATED => {
                let r: serde_json::Value = r.json().await?;
                if let Some(id) = r["id"].as_str() {
                    fleet
                        .posted
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id.to_owned(), at);
                }
                created += 1;
            }
            Ok(r) => {
                refused += 1;
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                if refused == 1 {
                    eprintln!("bench: a reservation was answered {status}: {text}");
                }
            }
            Err(e) => {
                refused += 1;
                if refused == 1 {
                    eprintln!("bench: a reservation failed: {e}");
                }
            }
        }
    }
    Ok((created, refused))
}

/// The tenant's reservations that are running, as the API lists them.
async fn running_reservations(fleet: &Fleet) -> anyhow::Result<u64> {
    let list: Vec<serde_json::Value> = fleet
        .http
        .get(format!("{}/api/v1/reservations", fleet.base))
        .bearer_auth(TENANT_TOKEN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(list.iter().filter(|r| r["status"] == "running").count() as u64)
}

/// `gpurent server` on the store, on a free loopback port, without rate limits or the
/// per-address connection cap (every simulated node comes from 127.0.0.1).
struct ControlPlane {
    child: tokio::process::Child,
    pid: u32,
    url: String,
}

impl ControlPlane {
    async fn start(url: &str, dir: &std::path::Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(dir.join("server.log"))?;
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .arg("server")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                url,
                "--rate-limit-per-token",
                "0",
                "--rate-limit-per-address",
                "0",
                "--max-connections-per-ip",
                "0",
                "--max-reservations-per-tenant",
                "0",
                "--max-spend-per-hour",
                "100000000.00",
            ])
            .env("GPURENT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("start the control plane (gpurent server)")?;
        let pid = child.id().context("the control plane's pid")?;
        let stdout = child.stdout.take().context("the control plane's stdout")?;
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(60),
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .context("the control plane printed no ready line within 60 s")??;
        let Some(url) = line.trim().strip_prefix("gpurent ready: ") else {
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            bail!("the control plane did not start: {line}{log}");
        };
        Ok(ControlPlane {
            pid,
            url: url.to_owned(),
            child,
        })
    }

    async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// Where PostgreSQL's CPU time for this database is read: its backends for the database,
/// by their process titles (`postgres: USER DB ...`); none on SQLite.
struct Database {
    name: Option<String>,
}

impl Database {
    fn of(url: &str) -> Self {
        let name = (!url.starts_with("sqlite")).then(|| {
            let path = url.rsplit('/').next().unwrap_or_default();
            path.split('?').next().unwrap_or_default().to_owned()
        });
        Database { name }
    }

    /// The CPU seconds of the database's backends now alive.
    fn cpu_seconds(&self) -> Option<f64> {
        let name = self.name.as_ref()?;
        let mut total = 0.0;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let path = entry.path();
            let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
                continue;
            };
            let title = String::from_utf8_lossy(&cmdline);
            let mut words = title.split_whitespace();
            if words.next() == Some("postgres:") && words.nth(1) == Some(name.as_str()) {
                total += cpu_seconds(&path.join("stat").to_string_lossy());
            }
        }
        Some(total)
    }
}

/// The time all of a process's threads ran and waited to run, in nanoseconds (the first two
/// fields of each thread's schedstat); zeros when it cannot be read.
fn schedstat(pid: u32) -> (f64, f64) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0.0, 0.0);
    };
    let mut total = (0.0, 0.0);
    for task in tasks.flatten() {
        let text = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let mut fields = text
            .split_whitespace()
            .map(|f| f.parse::<f64>().unwrap_or(0.0));
        total.0 += fields.next().unwrap_or(0.0);
        total.1 += fields.next().unwrap_or(0.0);
    }
    total
}
