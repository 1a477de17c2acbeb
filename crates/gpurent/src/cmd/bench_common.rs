//! What the benchmarks share: a fresh control plane with a join token, and percentiles.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gpurent_server::{hash_token, RunningServer, ServerConfig};
use gpurent_store::prelude::*;
use gpurent_store::SqlStore;
use gpurent_types::SystemClock;

/// The join token every benchmark's control plane accepts.
pub const JOIN_TOKEN: &str = "gpj_bench";

/// Seeds an empty store with the benchmarks' admin and the join token [`JOIN_TOKEN`], valid
/// for `valid`.
pub async fn admin_and_join_token(store: &SqlStore, valid: chrono::Duration) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    store
        .ensure_admin(&hash_token("gpr_bench_admin"), now)
        .await?;
    let admin = store
        .authenticate(&hash_token("gpr_bench_admin"))
        .await?
        .context("admin")?;
    store
        .create_join_token(&hash_token(JOIN_TOKEN), &admin.id, now + valid, now)
        .await?;
    Ok(())
}

/// A control plane on a fresh SQLite file in `dir`, on an ephemeral loopback port, with an
/// admin and the join token [`JOIN_TOKEN`].
pub async fn control_plane(
    dir: &std::path::Path,
) -> anyhow::Result<(Arc<SqlStore>, RunningServer)> {
    std::fs::create_dir_all(dir)?;
    let store = Arc::new(SqlStore::connect(&format!("sqlite://{}/bench.db", dir.display())).await?);
    admin_and_join_token(&store, chrono::Duration::hours(1)).await?;
    let server = RunningServer::start(
        "127.0.0.1:0".parse()?,
        store.clone(),
        Arc::new(SystemClock),
        ServerConfig::default().without_limits(),
    )
    .await?;
    Ok((store, server))
}

/// The `p` quantile (0 < p <= 1) of sorted durations, in milliseconds.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// The token of the tenant that benchmarks reserve as.
pub const TENANT_TOKEN: &str = "gpr_bench_tenant";

/// Creates the benchmarks' tenant (token [`TENANT_TOKEN`]) with `credit` whole units.
pub async fn bench_tenant(store: &SqlStore, credit: i64) -> anyhow::Result<String> {
    let tenant = gpurent_store::NewUser {
        name: "bench".into(),
        role: gpurent_types::Role::Tenant,
        token_hash: hash_token(TENANT_TOKEN),
        credit: gpurent_types::Money::units(credit),
    };
    Ok(store.create_user(tenant, chrono::Utc::now()).await?.id)
}

/// The resident memory of process `pid`, in MiB (0 when it cannot be read).
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// utime + stime of the process whose /proc stat file is `stat` (`/proc/PID/stat`), in
/// seconds (fields 14 and 15, 100 ticks/s); 0 when it cannot be read.
pub fn cpu_seconds(stat: &str) -> f64 {
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// The admin of a bench store (token `gpr_bench_admin`) and the join token `bench-join`.
pub async fn bench_admin(
    store: &SqlStore,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<gpurent_store::AuthUser> {
    store
        .ensure_admin(&hash_token("gpr_bench_admin"), now)
        .await?;
    let admin = store
        .authenticate(&hash_token("gpr_bench_admin"))
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
    Ok(admin)
}

/// Registers node `bench-N` with `gpus` simulated RTX 4090s (after [`bench_admin`]); its id.
pub async fn bench_node(
    store: &SqlStore,
    n: usize,
    gpus: u32,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<String> {
    let gpus = (0..gpus)
        .map(|i| {
            gpurent_types::agent::GpuInfo::basic(
                i,
                format!("GPU-bench-{n}-{i}"),
                "NVIDIA GeForce RTX 4090".into(),
                24_564,
            )
        })
        .collect();
    Ok(store
        .register_node(
            gpurent_store::NewNode {
                join_token_hash: "bench-join".into(),
                node_token_hash: format!("bench-node-{n}"),
                name: format!("bench-{n}"),
                executor: "sim".into(),
                gpu_backend: "sim".into(),
                gpus,
                verification: None,
                isolated: true,
                shared_network: false,
            },
            now,
        )
        .await?)
}

/// The process executor of a benchmark's node under `dir`: isolated as in production (root and
/// bubblewrap; in a network of its own per instance unless `shared_network`, with a disk of
/// `disk_gb` per instance, 0 for unbounded), or `unisolated`.
pub fn process_executor(
    dir: &std::path::Path,
    resources: gpurent_agent::executor::ResourcesPerGpu,
    unisolated: bool,
    shared_network: bool,
    disk_gb: u64,
) -> anyhow::Result<Arc<dyn gpurent_agent::Executor>> {
    use gpurent_agent::executor::{Isolation, ProcessExecutor};
    if unisolated {
        return Ok(Arc::new(ProcessExecutor::unisolated(
            &dir.join("agent"),
            None,
            resources,
        )?));
    }
    let executor = ProcessExecutor::isolated(
        &dir.join("agent"),
        &Isolation {
            cgroup_root: "/sys/fs/cgroup/gpurent-bench".into(),
            uid_base: gpurent_agent::executor::DEFAULT_INSTANCE_UID_BASE,
            allow_unisolated: false,
            hidden: Vec::new(),
        },
        resources,
    )
    .context("the isolated process executor (root and bubblewrap; or pass --unisolated)")?;
    let executor = if shared_network {
        executor.with_shared_network()
    } else {
        executor
    };
    if disk_gb == 0 {
        return Ok(Arc::new(executor));
    }
    let volumes =
        gpurent_agent::volumes::VolumeStore::open(dir.join("agent").join("volumes"), None)?;
    let scratch =
        gpurent_agent::executor::Scratch::new(volumes, disk_gb.saturating_mul(1_000_000_000))
            .map_err(|why| anyhow::anyhow!("instances' disks: {why}"))?;
    Ok(Arc::new(executor.with_scratch(scratch)))
}
