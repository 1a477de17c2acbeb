//! SIGHUP for `server` and `up`: the command line and configuration file read again, and what
//! can change without a restart put in force (prices, limits, health and host rules, idle
//! reclaim, the alert webhook, the TLS certificate's files); what cannot is named.

use std::collections::BTreeMap;

use anyhow::Context;
use gpurent_server::reload::Live;
use gpurent_server::RunningServer;

use crate::cli::{Command, Daemon, DaemonCommand, HostArgs};

/// The options a reload applies (their values, or their files' contents, read again).
const RELOADABLE: [&str; 14] = [
    "prices",
    "max-gpu-temp",
    "max-vram-pct",
    "min-driver",
    "min-cuda",
    "min-disk-free-gb",
    "idle-reclaim-minutes",
    "alert-webhook",
    "rate-limit-per-token",
    "rate-limit-per-address",
    "max-reservations-per-tenant",
    "max-spend-per-hour",
    "tls-cert",
    "tls-key",
];

/// Waits for SIGINT or SIGTERM; on each SIGHUP reloads, says what changed on stderr and in
/// the log, and serves on. A reload that fails leaves the settings in force.
pub async fn until_stopped(server: &RunningServer, daemon: Daemon) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    let mut options = options_now(daemon).unwrap_or_default();
    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => { r.context("cannot listen for SIGINT")?; break; }
            _ = term.recv() => break,
            _ = hup.recv() => match reload(server, daemon, &options) {
                Ok((said, now)) => {
                    options = now;
                    tracing::info!("reloaded on SIGHUP: {said}");
                }
                Err(e) => {
                    tracing::error!("reload on SIGHUP failed, the settings in force stay: {e:#}");
                }
            },
        }
    }
    tracing::info!("shutting down");
    Ok(())
}

/// Reads the command line and configuration file again, and puts what may change in force.
fn reload(
    server: &RunningServer,
    daemon: Daemon,
    before: &BTreeMap<String, String>,
) -> anyhow::Result<(String, BTreeMap<String, String>)> {
    let parsed = crate::config::parse(std::env::args_os().collect())
        .context("the command line and configuration file")?;
    let (prices, host, access) = match &parsed.cli.command {
        Command::Daemon(DaemonCommand::Server(args)) => {
            (args.prices.as_deref(), &args.host, &args.access)
        }
        Command::Daemon(DaemonCommand::Up(args)) => {
            (args.prices.as_deref(), &args.host, &args.access)
        }
        _ => anyhow::bail!("`{}` does not reload", daemon.name()),
    };
    let live = live(prices, host, access)?;
    let reloaded = server.reload(live)?;
    let now = options(&parsed.matches, daemon);
    let mut said = if reloaded.changed.is_empty() {
        "nothing changed".to_owned()
    } else {
        format!("changed {}", reloaded.changed.join(", "))
    };
    match reloaded.tls {
        Some(Ok(fingerprint)) => said.push_str(&format!("; TLS certificate {fingerprint}")),
        Some(Err(why)) => said.push_str(&format!(
            "; the TLS certificate's files did not load, the old one stays: {why}"
        )),
        None => {}
    }
    let restart: Vec<&str> = now
        .iter()
        .filter(|(k, v)| !RELOADABLE.contains(&k.as_str()) && before.get(*k) != Some(v))
        .chain(
            before
                .iter()
                .filter(|(k, _)| !RELOADABLE.contains(&k.as_str()) && !now.contains_key(*k)),
        )
        .map(|(k, _)| k.as_str())
        .collect();
    if !restart.is_empty() {
        said.push_str(&format!(
            "; not changed until a restart: {}",
            restart.join(", ")
        ));
    }
    Ok((said, now))
}

/// The settings a reload may change, from these options.
pub fn live(
    prices: Option<&std::path::Path>,
    host: &HostArgs,
    access: &crate::cli::AccessArgs,
) -> anyhow::Result<Live> {
    Ok(Live {
        prices: super::server::load_prices(prices)?,
        health_rules: super::server::health_rules(host),
        host_policy: super::server::host_policy(host),
        tenant_limits: super::server::tenant_limits(access),
        rate_limits: super::server::rate_limits(access),
        idle_reclaim: (host.idle_reclaim_minutes > 0)
            .then(|| std::time::Duration::from_secs(host.idle_reclaim_minutes * 60)),
        alert_webhook: host.alert_webhook.clone(),
    })
}

fn options_now(daemon: Daemon) -> Option<BTreeMap<String, String>> {
    let parsed = crate::config::parse(std::env::args_os().collect()).ok()?;
    Some(options(&parsed.matches, daemon))
}

/// Every option of the daemon's with a value, as its text, by long flag name.
fn options(matches: &clap::ArgMatches, daemon: Daemon) -> BTreeMap<String, String> {
    use clap::CommandFactory;
    let root = crate::cli::Cli::command();
    let Some(sub) = root.find_subcommand(daemon.name()) else {
        return BTreeMap::new();
    };
    let Some(sub_matches) = matches.subcommand_matches(daemon.name()) else {
        return BTreeMap::new();
    };
    sub.get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            let values = sub_matches.get_raw(arg.get_id().as_str())?;
            let text = values
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(",");
            Some((long.to_owned(), text))
        })
        .collect()
}
