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
    /// Job arrays: the scheduling pass with a big array queued, against the same tasks as
    /// plain queued reservations; and a whole array run through simulated GPUs.
    Array(BenchArrayArgs),
    /// Endpoints on the process executor: cold starts, the proxy's overhead, many endpoints, a
    /// load step (BENCHMARKS.md).
    Endpoint(BenchEndpointArgs),
    /// The small HTTP app of `bench endpoint`'s replicas (on 127.0.0.1:PORT).
    #[command(hide = true)]
    App {
        #[arg(long)]
        port: u16,
    },
    /// CPU and memory an agent costs, with telemetry at its heartbeat.
    Agent(BenchAgentArgs),
    /// Settlement periods of many running reservations.
    Settle(BenchSettleArgs),
    /// `admin backup` and `admin restore` of a control plane with many reservations, timed.
    Backup(BenchBackupArgs),
    /// `gpurent server`'s start to `/readyz` 200: on an empty data dir, and restarted on one
    /// with many reservations.
    Start(BenchStartArgs),
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
    /// Availability through faults: the HA stack of scripts/ha-up.sh (needs root), simulated
    /// agents and a steady mix of clients through its load balancer, while a fault is
    /// injected every 30-60 s; what the clients saw and whether anything was lost or run twice.
    Chaos(BenchChaosArgs),
    /// A rolling upgrade under load: the HA stack of scripts/ha-up.sh (needs root) and agents
    /// started on another release's binary, the replicas then the agents moved to this one, one
    /// at a time, while clients and simulated agents work; what the clients saw, and whether
    /// anything was lost or run twice.
    Upgrade(BenchUpgradeArgs),
}

#[derive(Debug, Args)]
pub struct BenchUpgradeArgs {
    /// The previous release's gpurent binary: the stack starts on it and is upgraded to this
    /// one (scripts/test.sh builds it: GPURENT_TEST_PREVIOUS_BIN).
    #[arg(long, value_name = "BIN")]
    pub from: PathBuf,
    /// Seconds of load before the first replica is upgraded, and again after the last agent.
    #[arg(long, default_value_t = 20.0)]
    pub settle_secs: f64,
    /// Real `gpurent agent` processes (process executor, simulated A100s), each running two
    /// long instances that must outlive the agent's upgrade.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub real_agents: u32,
    /// Simulated agents of 4 GPUs each, syncing through the load balancer.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub agents: u32,
    /// Tenants sending requests.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub tenants: u32,
    /// Client requests a second, all tenants together.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Heartbeats (of 2 s) a node may miss before it is fenced.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub missed_heartbeats: u32,
}

#[derive(Debug, Args)]
pub struct BenchChaosArgs {
    /// Minutes of load and faults, after the stack is up (about 2 minutes the first time).
    #[arg(long, default_value_t = 2.0)]
    pub minutes: f64,
    /// Seed of the faults' order, targets and times: the same seed, the same faults.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The kinds of fault, each injected once (in the seed's order) before any twice.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = FaultKind::ALL)]
    pub faults: Vec<FaultKind>,
    /// Fewest seconds from one fault to the next.
    #[arg(long, default_value_t = 30.0)]
    pub fault_every_min: f64,
    /// Most seconds from one fault to the next.
    #[arg(long, default_value_t = 60.0)]
    pub fault_every_max: f64,
    /// Simulated agents of 4 GPUs each, syncing through the load balancer.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub agents: u32,
    /// Tenants sending requests.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub tenants: u32,
    /// Client requests a second, all tenants together.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Heartbeats (of 2 s) a node may miss before it is fenced, for the replicas and the
    /// agents' leases (ha-up.sh's GPURENT_HA_MISSED_HEARTBEATS).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub missed_heartbeats: u32,
}

/// A fault of `bench chaos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// kill -9 of a replica, started again 3 s later.
    KillReplica,
    /// kill -9 of the PostgreSQL primary (its keeper and server, as a machine's death); the
    /// standby is promoted and the old primary rejoins as the standby.
    KillPrimary,
    /// SIGSTOP of a replica for 10 s.
    StopReplica,
    /// A simulated agent down for 3 s, its instances running on.
    RestartAgent,
    /// A replica cut from the database for 10 s (its connections dropped, new ones refused).
    CutReplica,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::KillReplica,
        FaultKind::KillPrimary,
        FaultKind::StopReplica,
        FaultKind::RestartAgent,
        FaultKind::CutReplica,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            FaultKind::KillReplica => "kill -9 of a replica",
            FaultKind::KillPrimary => "kill -9 of the PostgreSQL primary",
            FaultKind::StopReplica => "SIGSTOP of a replica for 10 s",
            FaultKind::RestartAgent => "an agent restarted",
            FaultKind::CutReplica => "a replica cut from the database for 10 s",
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_possible_value() {
            Some(v) => f.write_str(v.get_name()),
            None => write!(f, "{self:?}"),
        }
    }
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
    /// Give the tenant a quota of this many RTX 4090s (borrowing beyond it): the reservation
    /// path with quotas on.
    #[arg(long)]
    pub quota_gpus: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuditMode {
    On,
    Off,
    Both,
}

#[derive(Debug, Args)]
pub struct BenchArrayArgs {
    /// Tasks of the array (and plain reservations to compare with).
    #[arg(long, default_value_t = 10_000)]
    pub tasks: u64,
    /// The array's `%` limit for the pass (its window in the queue).
    #[arg(long, default_value_t = 1000)]
    pub limit: u32,
    /// Simulated GPUs while the pass is timed (the rest of the window waits in the queue).
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    /// Scheduling passes timed for each.
    #[arg(long, default_value_t = 30)]
    pub passes: usize,
    /// Leave out the plain reservations (minutes for 10,000 on two cores).
    #[arg(long)]
    pub no_plain: bool,
    /// Tasks of the array run to its end (exiting at once), and its limit and GPUs.
    #[arg(long, default_value_t = 2000)]
    pub run_tasks: u64,
    #[arg(long, default_value_t = 32)]
    pub run_gpus: u32,
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
    /// The isolated process executor's instances in the node's network, not one of their own
    /// each (as `gpurent agent --shared-network`), to compare the two.
    #[arg(long)]
    pub shared_network: bool,
    /// Each isolated process instance's disk, GB (as `gpurent agent --disk-per-gpu-gb`,
    /// one GPU each): a loop-mounted image made at its start. 0: unbounded, as before.
    #[arg(long, default_value_t = 10)]
    pub disk_gb: u64,
    /// Docker executor: remove the image from the Engine before each reservation, so that its
    /// node pulls it (from its registry: `--image HOST:PORT/NAME:TAG`), and time `docker pull`
    /// of the same image as many times, for comparison.
    #[arg(long)]
    pub pull: bool,
}

#[derive(Debug, Args)]
pub struct BenchEndpointArgs {
    /// Cold starts timed (first request to a scaled-to-zero endpoint, answered).
    #[arg(long, default_value_t = 20)]
    pub cold_starts: usize,
    /// Requests of each throughput run.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Endpoints of the many-endpoints run.
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    /// What each request of the overhead and many-endpoints runs takes the app, in ms (0: an
    /// app that answers at once, where the proxy's own CPU is all there is to measure).
    #[arg(long, default_value_t = 0)]
    pub app_ms: u64,
    /// The process executor without its sandbox; by default isolated as in production (root).
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
    /// Ready volumes of 100 GB to settle too, each period, after the reservations.
    #[arg(long, default_value_t = 10_000)]
    pub volumes: usize,
    /// Periods to settle, one minute apart (the first after the bulk load, then steady ones).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub periods: u16,
}

#[derive(Debug, Args)]
pub struct BenchBackupArgs {
    /// sqlite://PATH or postgres://... of an empty database to fill (default: a fresh SQLite
    /// file).
    #[arg(long)]
    pub database_url: Option<String>,
    /// On PostgreSQL: the empty database to restore into.
    #[arg(long)]
    pub restore_database_url: Option<String>,
    #[arg(long, default_value_t = 1_000_000)]
    pub reservations: usize,
    /// The directory of pg_dump and pg_restore (default: the PATH's).
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchStartArgs {
    /// Reservations in the data dir of the restarts (0: only the empty data dir).
    #[arg(long, default_value_t = 1_000_000)]
    pub reservations: usize,
    /// Starts of each case.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
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
