//! `gpurent server`: the control plane alone, on SQLite or PostgreSQL.

use std::sync::Arc;

use anyhow::Context;
use gpurent_billing::PriceList;
use gpurent_server::{
    bootstrap_admin, HealthRules, HostPolicy, RunningServer, ScaleConfig, ServerConfig,
};
use gpurent_store::SqlStore;
use gpurent_types::SystemClock;

use crate::cli::{HostArgs, LivenessArgs, ScaleArgs, ServerArgs};
use crate::output::print_line;

pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    super::ensure_dir(&args.data_dir)?;
    let tls = super::tls::server_tls(&args.tls, &args.data_dir, args.listen)?;
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", args.data_dir.join("gpurent.db").display()));
    let server = start(
        &url,
        &args.data_dir,
        args.listen,
        args.prices.as_deref(),
        std::time::Duration::from_secs(args.queue_timeout),
        Policies {
            scale: scale_config(&args.scale),
            host: &args.host,
            liveness: &args.liveness,
            tls,
        },
    )
    .await?;
    let https = server.state.config.tls.is_some();
    print_line(&format!(
        "gpurent ready: {}",
        super::local_url(server.addr, https)
    ));
    super::shutdown_signal().await?;
    let store = server.state.store.clone();
    server.shutdown().await.context("the HTTP server failed")?;
    drop(store);
    Ok(())
}

/// What the control plane is told to do besides serving: scale, admit and watch nodes.
pub struct Policies<'a> {
    pub scale: ScaleConfig,
    pub host: &'a HostArgs,
    pub liveness: &'a LivenessArgs,
    /// TLS on the listener; `None`: plain HTTP.
    pub tls: Option<gpurent_server::tls::TlsConfig>,
}

/// Opens the store, bootstraps the admin and starts serving.
pub async fn start(
    database_url: &str,
    data_dir: &std::path::Path,
    listen: std::net::SocketAddr,
    prices: Option<&std::path::Path>,
    queue_timeout: std::time::Duration,
    policies: Policies<'_>,
) -> anyhow::Result<RunningServer> {
    let Policies {
        scale,
        host,
        liveness,
        tls,
    } = policies;
    let prices = match prices {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the price file {}", path.display()))?;
            PriceList::from_toml(&text)
                .with_context(|| format!("in the price file {}", path.display()))?
        }
        None => PriceList::defaults(),
    };
    let store = SqlStore::connect(database_url)
        .await
        .with_context(|| format!("cannot open the store at {}", redact(database_url)))?;
    let clock = Arc::new(SystemClock);
    if let Some(path) = bootstrap_admin(&store, &*clock, data_dir).await? {
        tracing::info!("admin token written to {}", path.display());
    }
    let server = RunningServer::start(
        listen,
        Arc::new(store),
        clock,
        ServerConfig {
            prices,
            queue_timeout,
            scale,
            host_policy: host_policy(host),
            alert_webhook: host.alert_webhook.clone(),
            idle_reclaim: (host.idle_reclaim_minutes > 0)
                .then(|| std::time::Duration::from_secs(host.idle_reclaim_minutes * 60)),
            health_rules: health_rules(host),
            heartbeat_interval: liveness.heartbeat(),
            missed_heartbeats: liveness.missed_heartbeats.max(1),
            tls,
            ..ServerConfig::default()
        },
    )
    .await?;
    Ok(server)
}

/// The host verification rules of `up` and `server`.
pub fn host_policy(args: &HostArgs) -> HostPolicy {
    HostPolicy {
        min_driver: args.min_driver.clone(),
        min_cuda: args.min_cuda.clone(),
        min_disk_free_gb: args.min_disk_free_gb,
    }
}

/// The GPU health thresholds of `up` and `server`.
pub fn health_rules(args: &HostArgs) -> HealthRules {
    HealthRules {
        max_temperature_c: args.max_gpu_temp,
        max_vram_pct: args.max_vram_pct,
        ..HealthRules::default()
    }
}

/// The elastic capacity settings of `up` and `server`.
pub fn scale_config(args: &ScaleArgs) -> ScaleConfig {
    let defaults = ScaleConfig::default();
    ScaleConfig {
        hook_command: args.scale_hook_command.clone(),
        hook_url: args.scale_hook_url.clone(),
        interval: std::time::Duration::from_secs(args.scale_interval.max(1)),
        policy: gpurent_sched::elastic::ElasticConfig {
            min_nodes: args.scale_min_nodes,
            ..defaults.policy
        },
        ..defaults
    }
}

/// A database URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}
