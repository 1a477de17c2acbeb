//! One module per kind of command: daemons (`up`, `server`, `agent`) and API clients.

pub mod access;
pub mod admin_token;
pub mod agent;
pub mod audit;
pub mod backup;
pub mod backup_archive;
pub mod backup_restore;
pub mod bench;
pub mod bench_agent;
pub mod bench_app;
pub mod bench_array;
pub mod bench_audit;
pub mod bench_backup;
pub mod bench_chaos;
pub mod bench_common;
pub mod bench_console;
pub mod bench_endpoint;
pub mod bench_failover;
pub mod bench_fleet;
pub mod bench_fleet_agent;
pub mod bench_running;
pub mod bench_settle;
pub mod bench_ssh;
pub mod bench_start;
pub mod budget;
pub mod client;
pub mod cp;
pub mod endpoints;
pub mod instance_sftp;
pub mod lock;
pub mod notifications;
pub mod open;
pub mod port_forward;
pub mod prereqs;
pub mod private;
pub mod quotas;
pub mod registries;
pub mod reload;
pub mod report;
pub mod report_csv;
pub mod report_plot;
pub mod server;
pub mod sim;
pub mod sim_plot;
pub mod sim_replay;
pub mod ssh;
pub mod ssh_client;
pub mod ssh_config;
pub mod ssh_keys;
pub mod teams;
pub mod templates;
pub mod tls;
pub mod up;
pub mod volumes;

use std::path::Path;

use anyhow::Context;

/// Waits for SIGINT or SIGTERM.
pub async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("cannot listen for SIGINT")?,
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    Ok(())
}

/// The URL of the API on an address we listen on (0.0.0.0 is reached through loopback).
pub fn local_url(addr: std::net::SocketAddr, tls: bool) -> String {
    let ip = if addr.ip().is_unspecified() {
        "127.0.0.1".parse().unwrap_or(addr.ip())
    } else {
        addr.ip()
    };
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}", std::net::SocketAddr::new(ip, addr.port()))
}

/// Writes a new secret file readable by its owner only; an existing file is never replaced.
pub fn write_secret(
    path: &Path,
    contents: &str,
) -> Result<(), gpurent_types::keyfile::KeyFileError> {
    gpurent_types::keyfile::create_private(path, format!("{contents}\n").as_bytes())
}

/// Where the web console is, on stderr (stdout's `ready` line is the contract's).
pub fn console_hint(base: &str) {
    eprintln!(
        "gpurent console: {base}/ (log in with a user's name and password; the admin's is set with \
         `GPURENT_PASSWORD=... gpurent users passwd`)"
    );
}
