//! `gpurent bench ...`: the benchmarks and their arguments (see BENCHMARKS.md).

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use super::ExecutorKind;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Reservations per second and latency of POST /api/v1/reservations over HTTP.
    Reserve(BenchArgs),
    /// Reserve-to-running latency on a real executor, one reservation at a time.
    Running(BenchRunningArgs),
    /// CPU and memory an agent costs, with telemetry at its heartbeat.
    Agent(BenchAgentArgs),
    /// Settlement periods of many running reservations.
    Settle(BenchSettleArgs),
    /// Time until a reservation runs again elsewhere after its node's agent is killed.
    Failover(BenchFailoverArgs),
    /// Audit trail: records written per second in batches, and the whole trail verified.
    Audit(BenchAuditArgs),
    /// SSH into instances through the control plane: connect latency, scp throughput against
    /// the machine's own sshd, memory per idle session (needs ssh, scp and sshd).
    Ssh(BenchSshArgs),
    /// The web console: server time per page with a full store, the bytes of a first load,
    /// and the delay before a status change shows.
    Console(BenchConsoleArgs),
    /// Fleet scale: many simulated agents syncing with telemetry against one control plane,
    /// with reservations arriving; sync latency and the control plane's CPU and memory.
    Fleet(BenchFleetArgs),
}

#[derive(Debug, Args)]
pub struct BenchFleetArgs {
    /// sqlite://PATH or postgres://... of an empty database (default: a fresh SQLite file).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Simulated agents (nodes), all in this process.
    #[arg(long, default_value_t = 1000)]
    pub nodes: u32,
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus_per_node: u32,
    /// Seconds measured, after every node registered and synced for two heartbeats.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// Reservations of one GPU posted per second through the API.
    #[arg(long, default_value_t = 2.0)]
    pub reservations_per_sec: f64,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// sqlite://PATH or postgres://... (default: a fresh SQLite file).
    #[arg(long)]
    pub database_url: Option<String>,
    #[arg(long, default_value_t = 1000)]
    pub nodes: u32,
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    #[arg(long, default_value_t = 5000)]
    pub requests: u32,
    #[arg(long, default_value_t = 16)]
    pub concurrency: u32,
    /// With the audit trail (on, as in production), without it, or both in alternate rounds
    /// of one run (what the trail costs).
    #[arg(long, value_enum, default_value_t = AuditMode::On)]
    pub audit: AuditMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuditMode {
    On,
    Off,
    Both,
}

#[derive(Debug, Args)]
pub struct BenchRunningArgs {
    #[arg(long, value_enum, default_value = "docker")]
    pub executor: ExecutorKind,
    #[arg(long, default_value_t = 50)]
    pub reservations: u32,
    /// The image (docker executor).
    #[arg(long, default_value = "gpurent-test/busybox:latest")]
    pub image: String,
    /// The process executor without its sandbox (as `--allow-unisolated` runs it where it
    /// cannot be set up); by default each instance is isolated as in production (root).
    #[arg(long)]
    pub unisolated: bool,
}

#[derive(Debug, Args)]
pub struct BenchAgentArgs {
    /// The NVML probe whose first GPU is repeated `--gpus` times.
    #[arg(long)]
    pub fake_nvml: Option<PathBuf>,
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
}

#[derive(Debug, Args)]
pub struct BenchSettleArgs {
    /// sqlite://PATH or postgres://... (default: a fresh SQLite file).
    #[arg(long)]
    pub database_url: Option<String>,
    #[arg(long, default_value_t = 100_000)]
    pub reservations: usize,
    /// Periods to settle, one minute apart (the first after the bulk load, then steady ones).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub periods: u16,
}

#[derive(Debug, Args)]
pub struct BenchFailoverArgs {
    /// Failovers to measure.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub trials: u32,
}

#[derive(Debug, Args)]
pub struct BenchAuditArgs {
    /// sqlite://PATH or postgres://... (default: a fresh SQLite file).
    #[arg(long)]
    pub database_url: Option<String>,
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
}

#[derive(Debug, Args)]
pub struct BenchSshArgs {
    #[arg(long, value_enum, default_value = "docker")]
    pub executor: ExecutorKind,
    /// The image (docker executor).
    #[arg(long, default_value = "gpurent-test/busybox:latest")]
    pub image: String,
    /// Connects timed (`ssh ID echo ok`, to its first output).
    #[arg(long, default_value_t = 50)]
    pub connects: u32,
    /// MiB copied with scp, through gpurent and to this machine's sshd.
    #[arg(long, default_value_t = 1024)]
    pub copy_mib: u64,
    /// Idle interactive sessions held open to measure memory.
    #[arg(long, default_value_t = 64)]
    pub sessions: u32,
}

#[derive(Debug, Args)]
pub struct BenchConsoleArgs {
    /// Running reservations in the store (the tenant's).
    #[arg(long, default_value_t = 1000)]
    pub reservations: usize,
    /// Nodes of 8 GPUs each.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// Requests per page.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Status changes timed on the instances page.
    #[arg(long, default_value_t = 20)]
    pub status_trials: usize,
}
