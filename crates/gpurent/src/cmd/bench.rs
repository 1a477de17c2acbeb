//! `gpurent bench reserve`: reservations per second and latency of `POST /api/v1/reservations`
//! end to end over HTTP, against a fresh store with a large simulated inventory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_server::{RunningServer, ServerConfig};
use gpurent_store::SqlStore;
use gpurent_types::SystemClock;
use serde::Serialize;

use super::bench_common::percentile_ms;
use crate::cli::{AuditMode, BenchArgs};
use crate::output::{print_json, print_table};

/// Nodes registered beyond `--nodes`, with as many GPUs as the warm-up reserves before the measured rounds.
const WARM_NODES: u32 = 50;

#[derive(Debug, Serialize)]
struct BenchResult {
    backend: String,
    /// Whether every request was also written to the audit trail.
    audit: bool,
    /// Every request's token is checked and its role matched against the policy table.
    access_control: bool,
    /// Every request is timed into the server's Prometheus histograms.
    metrics: bool,
    /// Per-token and per-address rate limits, and the tenant caps: off, so that one
    /// tenant's thousands of requests are not refused.
    rate_limits: bool,
    /// Every request carries an `Idempotency-Key`, as `gpurent reserve` sends one.
    idempotency_keys: bool,
    /// The tenant's quota of the type, in GPUs (`--quota-gpus`), if any.
    quota_gpus: Option<u32>,
    nodes: u32,
    gpus: u32,
    /// Reservations placed before the measured rounds, for which 50 nodes beyond `nodes` are
    /// registered; then the planner's statistics are gathered (PostgreSQL), as in a database
    /// in service.
    warm_up: u32,
    /// Requests sent before each round is timed, one by each client on a connection of its
    /// own, which it keeps for the round as a client in service does; not measured, and
    /// placed on GPUs of nodes registered beyond `nodes` for them.
    opening_requests: u32,
    requests: u32,
    concurrency: u32,
    created: u32,
    errors: u32,
    reservations_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// The store's transactions per request (reservations and the audit trail's batches):
    /// what writing concurrent reservations together saves.
    transactions_per_request: f64,
}

pub async fn run(args: BenchArgs, json: bool) -> anyhow::Result<()> {
    let dir = tempdir()?;
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}/bench.db", dir.display()),
    };
    let backend = if url.starts_with("sqlite") {
        "sqlite"
    } else {
        "postgres"
    };
    let store = Arc::new(SqlStore::connect(&url).await.context("open the store")?);
    let clock = Arc::new(SystemClock);
    let now = chrono::Utc::now();

    // With the trail and without, in alternate rounds on the same store, so that the two
    // meet the same machine and an equally full cluster.
    let modes: &[bool] = match args.audit {
        AuditMode::On => &[true],
        AuditMode::Off => &[false],
        AuditMode::Both => &[false, true, false, true],
    };
    let rounds = u32::try_from(modes.len()).unwrap_or(1);
    let concurrency = args.concurrency.max(1);
    // Room for the warm-up and for each round's opening requests (the warm-up's too) beyond
    // the measured nodes.
    let opening = (rounds + 1) * concurrency;
    let extra = WARM_NODES + opening.div_ceil(args.gpus_per_node.max(1));
    eprintln!(
        "bench: registering {} nodes x {} GPUs, and {extra} more for the warm-up and the \
         opening requests",
        args.nodes, args.gpus_per_node
    );
    super::bench_common::bench_admin(&store, now).await?;
    for n in 0..args.nodes + extra {
        super::bench_common::bench_node(&store, usize::try_from(n)?, args.gpus_per_node, now)
            .await?;
    }
    let tenant_token = super::bench_common::TENANT_TOKEN;
    let tenant_id = super::bench_common::bench_tenant(&store, 1_000_000_000).await?;
    if let Some(gpus) = args.quota_gpus {
        // A quota on the type: every reservation reads where its tenant stands against it.
        use gpurent_store::QuotaStore;
        let quota = gpurent_sched::quota::Quota {
            guaranteed: u64::from(gpus) * gpurent_sched::quota::WHOLE,
            borrow_limit: None,
        };
        store.set_quota(&tenant_id, "rtx4090", quota, now).await?;
        eprintln!("bench: the tenant has a quota of {gpus} RTX 4090s, borrowing beyond it");
    }

    // Nodes are registered once and never heartbeat here: keep them live for the whole run.
    let config = ServerConfig {
        heartbeat_interval: Duration::from_secs(24 * 3600),
        missed_heartbeats: 1,
        ..ServerConfig::default()
    }
    .without_limits();
    // A database in service has reservations and statistics: a warm-up reserves as many GPUs
    // as the extra nodes have, and the statistics are gathered.
    let warm = WARM_NODES * args.gpus_per_node;
    eprintln!("bench: warm-up, {warm} reservations (not measured)");
    let warmed = round(
        store.clone(),
        clock.clone(),
        config.clone(),
        warm,
        concurrency,
        tenant_token,
    )
    .await?;
    if warmed.errors > 0 {
        bail!(
            "{} of the warm-up's {warm} reservations failed",
            warmed.errors
        );
    }
    store
        .refresh_statistics()
        .await
        .context("gather the planner's statistics")?;
    let mut by_mode: Vec<(bool, Round)> = Vec::new();
    for (i, &audit) in modes.iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(0);
        // Spread the remainder so that exactly `requests` are sent.
        let requests = args.requests / rounds + u32::from(i < args.requests % rounds);
        let mut config = config.clone();
        config.audit.enabled = audit;
        eprintln!(
            "bench: {requests} requests, {} at a time, against {backend}; audit trail {}, \
             access control and metrics on, rate limits and tenant caps off",
            args.concurrency,
            if audit { "on" } else { "off" }
        );
        let r = round(
            store.clone(),
            clock.clone(),
            config,
            requests,
            concurrency,
            tenant_token,
        )
        .await?;
        match by_mode.iter_mut().find(|(a, _)| *a == audit) {
            Some((_, total)) => total.add(r),
            None => by_mode.push((audit, r)),
        }
    }
    store.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    let mut results = Vec::new();
    for (audit, mut r) in by_mode {
        if r.latencies.is_empty() {
            bail!("no requests were made");
        }
        r.latencies.sort();
        let pct = |p: f64| percentile_ms(&r.latencies, p);
        let sent = u32::try_from(r.latencies.len()).unwrap_or(u32::MAX);
        let created = sent - r.errors;
        results.push(BenchResult {
            backend: backend.to_owned(),
            audit,
            access_control: true,
            metrics: true,
            rate_limits: false,
            idempotency_keys: true,
            quota_gpus: args.quota_gpus,
            nodes: args.nodes,
            gpus: args.nodes * args.gpus_per_node,
            warm_up: warm,
            opening_requests: concurrency,
            requests: sent,
            concurrency: args.concurrency,
            created,
            errors: r.errors,
            reservations_per_sec: f64::from(created) / r.elapsed.as_secs_f64(),
            p50_ms: pct(0.50),
            p99_ms: pct(0.99),
            max_ms: pct(1.0),
            transactions_per_request: f64::from(u32::try_from(r.transactions).unwrap_or(u32::MAX))
                / f64::from(sent.max(1)),
        });
    }
    if json {
        return match results.as_slice() {
            [one] => print_json(one),
            all => print_json(&all),
        }
        .map_err(|e| anyhow::anyhow!(e));
    }
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|result| {
            vec![
                result.backend.clone(),
                if result.audit { "on" } else { "off" }.to_owned(),
                result.gpus.to_string(),
                result.requests.to_string(),
                result.concurrency.to_string(),
                result.created.to_string(),
                format!("{:.0}", result.reservations_per_sec),
                format!("{:.2}", result.p50_ms),
                format!("{:.2}", result.p99_ms),
                format!("{:.2}", result.max_ms),
            ]
        })
        .collect();
    print_table(
        &[
            "backend",
            "audit",
            "GPUs",
            "requests",
            "concurrency",
            "created",
            "reservations/s",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
        &rows,
    );
    Ok(())
}

/// What one round of requests measured.
struct Round {
    latencies: Vec<Duration>,
    errors: u32,
    elapsed: Duration,
    transactions: u64,
}

impl Round {
    fn add(&mut self, other: Round) {
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.transactions += other.transactions;
    }
}

/// Starts a control plane with `config` on the store, sends `requests` reservations,
/// `concurrency` at a time, and stops it.
async fn round(
    store: Arc<SqlStore>,
    clock: Arc<SystemClock>,
    config: ServerConfig,
    requests: u32,
    concurrency: u32,
    tenant_token: &'static str,
) -> anyhow::Result<Round> {
    let server = RunningServer::start("127.0.0.1:0".parse()?, store.clone(), clock, config).await?;
    let endpoint = format!("http://{}/api/v1/reservations", server.addr);
    let client = reqwest::Client::new();
    let concurrency = concurrency.max(1);
    // Each client opens its connection with a request of its own, not timed: a round measures
    // clients in service, not a fresh server's first batch and connections (which were 16 of
    // a round's slowest requests, half of a 3,000-request round's 1 % above the p99).
    let mut opening = Vec::new();
    for _ in 0..concurrency {
        let (client, endpoint) = (client.clone(), endpoint.clone());
        opening.push(tokio::spawn(async move {
            send(&client, &endpoint, tenant_token).await
        }));
    }
    let mut refused = 0;
    for o in opening {
        refused += u32::from(!o.await?);
    }
    if refused > 0 {
        server.shutdown().await?;
        bail!("{refused} of the round's {concurrency} opening requests failed");
    }
    let begun = store.transactions_begun();
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..concurrency {
        let per_worker = requests / concurrency + u32::from(w < requests % concurrency);
        let (client, endpoint) = (client.clone(), endpoint.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_worker as usize);
            let mut errors = 0u32;
            for _ in 0..per_worker {
                let t = Instant::now();
                let ok = send(&client, &endpoint, tenant_token).await;
                latencies.push(t.elapsed());
                if !ok {
                    errors += 1;
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for w in workers {
        let (l, e) = w.await?;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed();
    server.shutdown().await?;
    Ok(Round {
        latencies,
        errors,
        elapsed,
        transactions: store.transactions_begun() - begun,
    })
}

/// One reservation of a GPU for an hour; whether it was created.
async fn send(client: &reqwest::Client, endpoint: &str, tenant_token: &str) -> bool {
    client
        .post(endpoint)
        .bearer_auth(tenant_token)
        // As `gpurent reserve` sends it: a retry finds the first reservation.
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(&serde_json::json!({"gpu_type": "rtx4090", "hours": 1}))
        .send()
        .await
        .is_ok_and(|r| r.status() == reqwest::StatusCode::CREATED)
}

fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}
