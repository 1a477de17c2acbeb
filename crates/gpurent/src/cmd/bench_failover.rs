//! `gpurent bench failover`: how long a reservation is down when its node dies. A control
//! plane and two agents (sim executor, one RTX 4090 each) run in this process with the default
//! liveness (2 s heartbeats, 3 missed beats); each trial kills the agent running the
//! reservation (its task aborted, no clean shutdown) and measures the time until the control
//! plane knows the reservation running on the other node: detection (the node TTL, counted
//! from its last heartbeat), the maintenance tick that fences it and places the work again,
//! and the other agent's start. The killed agent is then restarted (it stops its stale copy)
//! for the next trial.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_agent::executor::SimExecutor;
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{Agent, AgentConfig, Executor, GpuBackend};
use gpurent_server::ServerConfig;
use gpurent_types::api::{Node, Reservation};
use gpurent_types::ReservationStatus;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::bench_common::{control_plane, percentile_ms, JOIN_TOKEN};
use crate::cli::BenchFailoverArgs;
use crate::output::{print_json, print_table};

#[derive(Debug, Serialize)]
struct FailoverResult {
    trials: usize,
    heartbeat_ms: u128,
    missed_heartbeats: u32,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    min_ms: f64,
}

struct Node1 {
    name: String,
    dir: std::path::PathBuf,
    gpus: Arc<dyn GpuBackend>,
    executor: Arc<dyn Executor>,
    task: Option<JoinHandle<Result<(), gpurent_agent::AgentError>>>,
    stop: Option<watch::Sender<bool>>,
}

impl Node1 {
    fn start(&mut self, base: &str, config: &ServerConfig) {
        let mut agent = AgentConfig::new(base, self.dir.clone(), &self.name);
        agent.join_token = Some(JOIN_TOKEN.to_owned());
        agent.heartbeat = config.heartbeat_interval;
        // As `gpurent agent` sets it by default: a heartbeat less than the node TTL.
        agent.lease = config
            .node_ttl()
            .saturating_sub(config.heartbeat_interval)
            .max(config.heartbeat_interval);
        let (stop, stopped) = watch::channel(false);
        self.task = Some(tokio::spawn(
            Agent::new(agent, self.gpus.clone(), self.executor.clone()).run(stopped),
        ));
        self.stop = Some(stop);
    }

    async fn kill(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        self.stop = None;
    }
}

pub async fn run(args: BenchFailoverArgs, json: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-failover-{}", std::process::id()));
    let (store, server) = control_plane(&dir).await?;
    let config = (*server.state.config).clone();
    let _now = chrono::Utc::now();
    let tenant = super::bench_common::TENANT_TOKEN;
    let admin = "gpr_bench_admin";
    super::bench_common::bench_tenant(&store, 1_000_000).await?;
    let base = format!("http://{}", server.addr);
    let mut nodes: Vec<Node1> = Vec::new();
    for name in ["failover-a", "failover-b"] {
        let mut node = Node1 {
            name: name.to_owned(),
            dir: dir.join(name),
            gpus: Arc::new(SimGpus::parse("1xRTX4090", name)?),
            executor: Arc::new(SimExecutor::new()),
            task: None,
            stop: None,
        };
        node.start(&base, &config);
        nodes.push(node);
    }
    let http = reqwest::Client::new();
    let ready = |name: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            for _ in 0..1000 {
                let ns: Vec<Node> = http
                    .get(format!("{base}/api/v1/nodes"))
                    .bearer_auth(admin)
                    .send()
                    .await?
                    .json()
                    .await?;
                if ns.iter().any(|n| n.name == name && n.status == "ready") {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            bail!("node {name} never became ready")
        }
    };
    for n in &nodes {
        ready(n.name.clone()).await?;
    }
    eprintln!(
        "bench: {} failovers, heartbeat {:?} x {} missed beats (TTL {:?})",
        args.trials,
        config.heartbeat_interval,
        config.missed_heartbeats,
        config.node_ttl()
    );
    let get = |id: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let r: Reservation = http
                .get(format!("{base}/api/v1/reservations/{id}"))
                .bearer_auth(tenant)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            anyhow::Ok(r)
        }
    };
    let created: Reservation = http
        .post(format!("{base}/api/v1/reservations"))
        .bearer_auth(tenant)
        .json(&serde_json::json!({"gpu_type": "rtx4090", "hours": 24}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let id = created.id;
    let mut times = Vec::new();
    for trial in 0..args.trials {
        let trial = u64::from(trial);
        // Running, with the other node ready to take it.
        let mut on = None;
        for _ in 0..1000 {
            let r = get(id.clone()).await?;
            if r.status == ReservationStatus::Running {
                on = r.node.clone().map(|n| (n, r.epoch));
                break;
            }
            if r.status.is_terminal() {
                bail!("the reservation ended as {}", r.status);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (node, epoch) = on.context("the reservation did not run within 10 s")?;
        let victim = nodes
            .iter()
            .position(|n| n.name == node)
            .context("an unknown node")?;
        ready(nodes[1 - victim].name.clone()).await?;
        // Kill at a random moment of the heartbeat, as a crash would.
        let phase = trial * 397 % 2000;
        tokio::time::sleep(Duration::from_millis(phase)).await;
        nodes[victim].kill().await;
        let killed = Instant::now();
        let mut moved = None;
        for _ in 0..3000 {
            let r = get(id.clone()).await?;
            if r.status == ReservationStatus::Running
                && r.epoch > epoch
                && r.node.as_deref() != Some(node.as_str())
            {
                moved = Some(killed.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took = moved.context("the reservation did not run elsewhere within 30 s")?;
        eprintln!("bench: trial {}: {:.2} s", trial + 1, took.as_secs_f64());
        times.push(took);
        nodes[victim].start(&base, &config);
        ready(nodes[victim].name.clone()).await?;
    }
    for n in &mut nodes {
        if let Some(stop) = n.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(task) = n.task.take() {
            let _ = task.await;
        }
    }
    server.shutdown().await?;
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);

    times.sort();
    let result = FailoverResult {
        trials: times.len(),
        heartbeat_ms: config.heartbeat_interval.as_millis(),
        missed_heartbeats: config.missed_heartbeats,
        p50_ms: percentile_ms(&times, 0.5),
        p99_ms: percentile_ms(&times, 0.99),
        max_ms: percentile_ms(&times, 1.0),
        min_ms: times.first().map_or(0.0, |t| t.as_secs_f64() * 1000.0),
    };
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    {
        print_table(
            &[
                "trials",
                "heartbeat",
                "missed beats",
                "p50",
                "p99",
                "max",
                "min",
            ],
            &[vec![
                result.trials.to_string(),
                format!("{} ms", result.heartbeat_ms),
                result.missed_heartbeats.to_string(),
                format!("{:.2} s", result.p50_ms / 1000.0),
                format!("{:.2} s", result.p99_ms / 1000.0),
                format!("{:.2} s", result.max_ms / 1000.0),
                format!("{:.2} s", result.min_ms / 1000.0),
            ]],
        );
        Ok(())
    }
}
