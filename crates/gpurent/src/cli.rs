//! The command line, as `../shared/docs/cli-contract.md` fixes it: the global options here,
//! the daemon commands in `cli/daemon.rs` (benchmarks in `cli/bench.rs`) and the API commands
//! in `cli/api.rs`, each command's arguments beside it.

mod api;
mod bench;
mod budget;
mod config;
mod daemon;
mod endpoints;
mod notifications;
mod quotas;
mod registries;
mod teams;
mod templates;
mod tokens;
mod volumes;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use api::*;
pub use bench::*;
pub use budget::*;
pub use config::*;
pub use daemon::*;
pub use endpoints::*;
pub use notifications::*;
pub use quotas::*;
pub use registries::*;
pub use teams::*;
pub use templates::*;
pub use tokens::*;
pub use volumes::*;

#[derive(Debug, Parser)]
#[command(
    name = "gpurent",
    version,
    about = "Rent GPUs by the second: control plane, node agent and CLI",
    after_help = "Guides: docs/tenants.md (reserving, logs, ssh, billing), docs/hosts.md (a GPU \
                  host's agent), docs/operators.md (the control plane), docs/configuration.md \
                  (configuration files)."
)]
pub struct Cli {
    /// The control plane's URL.
    #[arg(
        long,
        global = true,
        env = "GPURENT_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// API token (default: the admin token in ./gpurent-data/admin.token, or
    /// GPURENT_DATA_DIR's, but only for the server that data dir's `up`/`server` wrote to its
    /// server.url; any other --server needs --token).
    #[arg(long, global = true, env = "GPURENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print exactly one JSON document on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// An https:// control plane: trust this CA (or self-signed certificate), a PEM file.
    #[arg(long, global = true, env = "GPURENT_CA_CERT", value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,
    /// An https:// control plane: accept exactly the certificate with this SHA-256 (hex, as
    /// `--tls-self-signed` prints it), whoever signed it.
    #[arg(
        long,
        global = true,
        env = "GPURENT_TLS_FINGERPRINT",
        value_name = "SHA256HEX",
        conflicts_with = "ca_cert"
    )]
    pub tls_fingerprint: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// How the CLI and the agent trust an https:// control plane.
    pub fn client_tls(&self) -> gpurent_agent::tls::ClientTls {
        gpurent_agent::tls::ClientTls {
            ca_cert: self.ca_cert.clone(),
            fingerprint: self.tls_fingerprint.clone(),
            client_cert: None,
        }
    }
}

/// Every command, in one list as the contract has it: the daemons' and the API's, flattened.
#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(flatten)]
    Daemon(DaemonCommand),
    #[command(flatten)]
    Api(ApiCommand),
}
