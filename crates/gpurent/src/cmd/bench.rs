//! `gpurent bench reserve`: reservations per second and latency of `POST /api/v1/reservations`
//! end to end over HTTP, against a fresh store with a large simulated inventory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_server::{hash_token, RunningServer, ServerConfig};
use gpurent_store::prelude::*;
use gpurent_store::{NewNode, NewUser, SqlStore};
use gpurent_types::agent::GpuInfo;
use gpurent_types::{Money, Role, SystemClock};
use serde::Serialize;

use super::bench_common::percentile_ms;
use crate::cli::BenchArgs;
use crate::output::{print_json, print_table};

#[derive(Debug, Serialize)]
struct BenchResult {
    backend: String,
    nodes: u32,
    gpus: u32,
    requests: u32,
    concurrency: u32,
    created: u32,
    errors: u32,
    reservations_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
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

    eprintln!(
        "bench: registering {} nodes x {} GPUs",
        args.nodes, args.gpus_per_node
    );
    let admin_token = "gpr_bench_admin";
    store.ensure_admin(&hash_token(admin_token), now).await?;
    let admin = store
        .authenticate(&hash_token(admin_token))
        .await?
        .context("admin")?;
    store
        .create_join_token(
            "bench-join",
            &admin.id,
            now + chrono::Duration::days(1),
            now,
        )
        .await?;
    for n in 0..args.nodes {
        let gpus = (0..args.gpus_per_node)
            .map(|i| {
                GpuInfo::basic(
                    i,
                    format!("GPU-bench-{n}-{i}"),
                    "NVIDIA GeForce RTX 4090".into(),
                    24_564,
                )
            })
            .collect();
        store
            .register_node(
                NewNode {
                    join_token_hash: "bench-join".into(),
                    node_token_hash: format!("bench-node-{n}"),
                    name: format!("bench-{n}"),
                    executor: "sim".into(),
                    gpu_backend: "sim".into(),
                    gpus,
                    verification: None,
                },
                now,
            )
            .await?;
    }
    let tenant_token = "gpr_bench_tenant";
    let new = NewUser {
        name: "bench".into(),
        role: Role::Tenant,
        token_hash: hash_token(tenant_token),
        credit: Money::units(1_000_000_000),
    };
    store.create_user(new, now).await?;

    // Nodes are registered once and never heartbeat here: keep them live for the whole run.
    let config = ServerConfig {
        heartbeat_interval: Duration::from_secs(24 * 3600),
        missed_heartbeats: 1,
        ..ServerConfig::default()
    }
    .without_limits();
    let server = RunningServer::start("127.0.0.1:0".parse()?, store.clone(), clock, config).await?;
    let endpoint = format!("http://{}/api/v1/reservations", server.addr);

    eprintln!(
        "bench: {} requests, {} at a time, against {}",
        args.requests, args.concurrency, backend
    );
    let client = reqwest::Client::new();
    let concurrency = args.concurrency.max(1);
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..concurrency {
        // Spread the remainder so that exactly `requests` are sent.
        let per_worker = args.requests / concurrency + u32::from(w < args.requests % concurrency);
        let (client, endpoint) = (client.clone(), endpoint.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_worker as usize);
            let mut errors = 0u32;
            let body = serde_json::json!({"gpu_type": "rtx4090", "hours": 1});
            for _ in 0..per_worker {
                let t = Instant::now();
                let ok = client
                    .post(&endpoint)
                    .bearer_auth(tenant_token)
                    .json(&body)
                    .send()
                    .await
                    .map(|r| r.status() == reqwest::StatusCode::CREATED)
                    .unwrap_or(false);
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
    store.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    if latencies.is_empty() {
        bail!("no requests were made");
    }
    latencies.sort();
    let pct = |p: f64| percentile_ms(&latencies, p);
    let sent = u32::try_from(latencies.len()).unwrap_or(u32::MAX);
    let created = sent - errors;
    let result = BenchResult {
        backend: backend.to_owned(),
        nodes: args.nodes,
        gpus: args.nodes * args.gpus_per_node,
        requests: sent,
        concurrency: args.concurrency,
        created,
        errors,
        reservations_per_sec: f64::from(created) / elapsed.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
    };
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    print_table(
        &[
            "backend",
            "GPUs",
            "requests",
            "concurrency",
            "created",
            "reservations/s",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
        &[vec![
            result.backend.clone(),
            result.gpus.to_string(),
            result.requests.to_string(),
            result.concurrency.to_string(),
            result.created.to_string(),
            format!("{:.0}", result.reservations_per_sec),
            format!("{:.2}", result.p50_ms),
            format!("{:.2}", result.p99_ms),
            format!("{:.2}", result.max_ms),
        ]],
    );
    Ok(())
}

fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}
