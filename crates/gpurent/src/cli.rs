//! The command line, as `../shared/docs/cli-contract.md` fixes it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "gpurent",
    version,
    about = "Rent GPUs by the second: control plane, node agent and CLI"
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

/// TLS on the control plane's listener (`up`, `server`). Without it, plain HTTP is allowed on
/// loopback only, unless `--allow-insecure-http`.
#[derive(Debug, Args)]
pub struct ServerTlsArgs {
    /// The server certificate chain (PEM); reloaded when the file changes.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Make a key and a self-signed certificate in DATA_DIR on first start (`tls.crt`,
    /// `tls.key`), reuse them afterwards; its SHA-256 goes to stderr and DATA_DIR/tls.fingerprint.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls_self_signed: bool,
    /// Serve plain HTTP on a non-loopback address anyway (tokens cross the network in clear).
    #[arg(long)]
    pub allow_insecure_http: bool,
    /// How often the certificate files are checked for a new certificate.
    #[arg(long, value_name = "SECONDS", default_value_t = 2)]
    pub tls_reload_secs: u64,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serves SFTP for an instance on stdin/stdout (the agent runs it for SSH sessions).
    #[command(name = "instance-sftp", hide = true)]
    InstanceSftp(InstanceSftpArgs),
    /// Everything on one machine: control plane on SQLite plus a local node agent.
    Up(Box<UpArgs>),
    /// The control plane only.
    Server(Box<ServerArgs>),
    /// A node agent on a GPU host.
    Agent(AgentArgs),
    /// Manage users (admin).
    #[command(subcommand)]
    Users(UsersCommand),
    /// Prepaid credit (admin).
    #[command(subcommand)]
    Credit(CreditCommand),
    /// API tokens: create with an expiry, list, revoke.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Your SSH public keys, for `ssh RESERVATION_ID@HOST`: add, list, remove.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Log in with a password (GPURENT_PASSWORD, else one line of stdin); prints a session
    /// token that expires.
    Login { name: String },
    /// Your balance.
    Balance,
    /// GPUs you can rent now, per type, with prices.
    Offers,
    /// What you were charged, per reservation and per day (UTC).
    Usage(Window),
    /// A monthly invoice (UTC calendar month), as JSON or CSV.
    Invoice {
        /// YYYY-MM.
        month: String,
        /// Print CSV (one row per reservation and a total row) instead of a table.
        #[arg(long)]
        csv: bool,
        /// Whose invoice (admin).
        #[arg(long)]
        user: Option<String>,
    },
    /// What your nodes earned, per node (hosts).
    Earnings(Window),
    /// Reserve GPUs.
    Reserve(ReserveArgs),
    /// Show one reservation.
    Get { id: String },
    /// Print a one-time link to a published HTTP port (`reserve --http-port`) for a browser:
    /// valid 5 minutes, opened once; it sets a cookie for that port for 12 hours.
    Open {
        id: String,
        port: u16,
        /// Also open it with `xdg-open`.
        #[arg(long)]
        browser: bool,
    },
    /// List your reservations (admin: all).
    Ls,
    /// Stop a reservation; billing ends now.
    Stop { id: String },
    /// A reservation's log.
    Logs {
        id: String,
        /// Keep printing until the reservation ends.
        #[arg(long, short)]
        follow: bool,
        /// Write the whole log (its bytes as they are) to this file instead of printing it:
        /// a copy to keep past the control plane's log retention.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Open a shell (or run CMD) in a running reservation with the system's `ssh`, the
    /// control plane's host key pinned.
    Ssh(SshArgs),
    /// Print OpenSSH `Host` blocks (`gpurent-ID`) for your running reservations, or one, for
    /// ~/.ssh/config or VS Code Remote-SSH, with the host key pinned in a known_hosts file it
    /// writes. Use: `gpurent ssh-config --write`, then `ssh gpurent-ID` (or by hand:
    /// `gpurent ssh-config > ~/.ssh/gpurent.conf` and `Include gpurent.conf` at the top of
    /// ~/.ssh/config).
    SshConfig(SshConfigArgs),
    /// Copy a file (or with -r a directory) into or out of a running reservation:
    /// `gpurent cp FILE ID:PATH` or `gpurent cp ID:PATH FILE`. No ssh binary needed.
    Cp(CpArgs),
    /// Forward 127.0.0.1:LOCAL to port REMOTE inside a running reservation until Ctrl-C.
    /// No ssh binary needed.
    PortForward(PortForwardArgs),
    /// Nodes (admin: all; hosts: their own).
    #[command(subcommand)]
    Nodes(NodesCommand),
    /// What happened to nodes: GPU health breaches and recoveries (admin).
    Events {
        /// Only events after this id.
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Keep printing new events as they happen (one line each; JSON lines with --json).
        #[arg(long, short)]
        follow: bool,
    },
    /// Checks of the platform's books (admin).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Usage reports (admin): a day as CSV, JSON and charts, a week per price tier.
    #[command(subcommand)]
    Report(ReportCommand),
    /// The audit trail of every API request (admin): verify, search, export.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Print the OpenAPI document of the HTTP API.
    Openapi,
    /// Benchmarks (see BENCHMARKS.md).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Replay a trace through the placement policies (the FGD paper's experiment), offline.
    Sim(SimArgs),
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// Node list CSV (`sn,cpu_milli,memory_mib,gpu,model`).
    #[arg(long)]
    pub nodes: PathBuf,
    /// Pod list CSV (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...`).
    #[arg(long)]
    pub pods: PathBuf,
    /// One policy (random, dot-product, gpu-clustering, gpu-packing, best-fit, fgd, vram-weighted) or all.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// The seed of the arrivals and of tie-breaks.
    #[arg(long, default_value_t = 42, conflicts_with = "seeds")]
    pub seed: u64,
    /// Run N seeds, 42 to 42+N-1 as in the paper, and report the means (for the P99 decision
    /// time, the mean of each seed's 99th percentile).
    #[arg(long)]
    pub seeds: Option<u64>,
    /// Also draw GPU allocation against arrived GPU request, one line per policy, into FILE
    /// (PNG if it ends in .png, SVG if .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Replay the pod list's own creation and deletion times instead (a FIFO queue with
    /// backfill for what does not fit): placed pods, mean and p99 wait per policy.
    #[arg(long, conflicts_with_all = ["seeds", "plot"])]
    pub replay: bool,
}

/// A statement's time window and whose it is.
#[derive(Debug, Args)]
pub struct Window {
    /// Start, YYYY-MM-DD or RFC 3339 (default: the beginning).
    #[arg(long)]
    pub from: Option<String>,
    /// End, exclusive (default: now).
    #[arg(long)]
    pub to: Option<String>,
    /// Whose statement (admin; default: yours).
    #[arg(long)]
    pub user: Option<String>,
}

impl Window {
    /// The query string of a statement request.
    pub fn query(&self) -> String {
        [
            ("from", &self.from),
            ("to", &self.to),
            ("user_id", &self.user),
        ]
        .into_iter()
        .filter_map(|(k, v)| {
            v.as_ref()
                .map(|v| format!("{k}={}", crate::cmd::client::segment(v)))
        })
        .collect::<Vec<_>>()
        .join("&")
    }
}

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
pub struct BenchAuditArgs {
    /// sqlite://PATH or postgres://... (default: a fresh SQLite file).
    #[arg(long)]
    pub database_url: Option<String>,
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
}

#[derive(Debug, Args)]
pub struct BenchFailoverArgs {
    /// Failovers to measure.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub trials: u32,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnNodeLossArg {
    Reschedule,
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExecutorKind {
    /// Where a Docker Engine answers (`DOCKER_HOST`'s unix socket, else
    /// /var/run/docker.sock), instances with an image as containers and the others as isolated
    /// processes (Docker alone where processes cannot be isolated, and with `--mps`); else
    /// isolated processes; never sim, even for simulated GPUs.
    Auto,
    /// Each instance a container (needs `--image`).
    Docker,
    /// Each instance a sandboxed process tree in a cgroup (root and bubblewrap).
    Process,
    /// Nothing runs: instances only report `running` (tests and benchmarks).
    Sim,
}

/// Where a node's work runs and with which resources.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Simulated GPUs, e.g. "2xRTX4090,1xA100-80GB" (default for `up`: real GPUs through NVML,
    /// else 2xRTX4090).
    #[arg(long)]
    pub sim_gpus: Option<String>,
    /// Replay an NVML probe (JSON) instead of asking the driver (tests and demos).
    #[arg(long, hide = true)]
    pub fake_nvml: Option<PathBuf>,
    /// Where instances run.
    #[arg(long, value_enum, default_value = "auto")]
    pub executor: ExecutorKind,
    /// CPUs each reserved GPU brings to its instance, at most the host's cores divided among
    /// its GPUs (a share gets its whole GPU's part).
    #[arg(long, default_value_t = 4)]
    pub cpus_per_gpu: u32,
    /// Memory (GiB) each reserved GPU brings to its instance, at most the host's memory
    /// divided among its GPUs.
    #[arg(long, default_value_t = 16)]
    pub memory_per_gpu_gb: u64,
    /// Out of touch with the control plane for longer than this, the agent stops its
    /// instances (self-fencing), so work rescheduled elsewhere never runs twice (default: half
    /// a heartbeat less than the node TTL, heartbeat interval x missed heartbeats, after which
    /// the control plane reschedules the work).
    #[arg(long)]
    pub lease_secs: Option<u64>,
    /// The cgroup v2 directory the process executor puts instances under (where only cgroup
    /// v1 exists: a cgroup of this name under its memory, cpu and pids hierarchies).
    #[arg(long, default_value = "/sys/fs/cgroup/gpurent")]
    pub cgroup_root: PathBuf,
    /// The process executor runs each instance as a uid of its own, the lowest free one of the
    /// 65536 from this one on; no user of the node may have one of them, nor another agent on
    /// the node the same range.
    #[arg(long, value_name = "UID", default_value_t = gpurent_agent::executor::DEFAULT_INSTANCE_UID_BASE)]
    pub instance_uid_base: u32,
    /// Where the process executor cannot isolate instances (no bubblewrap, no namespaces, no
    /// writable cgroup tree, not root), run them anyway, with the agent's rights, instead of
    /// refusing to start: tenants can then read this node's credentials and each other's
    /// work. `nodes ls` and the offers say `unisolated`.
    #[arg(long)]
    pub allow_unisolated: bool,
    /// Burn in the GPUs while the node is idle with this stress command (run with `sh -c`,
    /// `CUDA_VISIBLE_DEVICES` and `GPURENT_BURN_IN_SECONDS` set; exit 0 passes). The node takes
    /// no work meanwhile, nor after a failed run until one passes. Off when not given.
    #[arg(long, value_name = "COMMAND")]
    pub burn_in_command: Option<String>,
    /// Minutes between burn-ins of an idle node.
    #[arg(long, value_name = "MINUTES", default_value_t = 120)]
    pub burn_in_every_mins: u64,
    /// Minutes each burn-in runs (`GPURENT_BURN_IN_SECONDS`).
    #[arg(long, value_name = "MINUTES", default_value_t = 10)]
    pub burn_in_mins: u64,
    /// Where the checkpoint volumes of reservations made with `--checkpoint` live, one
    /// directory each (default DATA_DIR/checkpoints). Mount the same shared storage here on
    /// every node and a run rescheduled after a node loss finds what the last one saved.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Restores a checkpoint volume before each start and saves it after each stop (run with
    /// `sh -c`; `GPURENT_CHECKPOINT_ACTION` is `restore` or `save`, `GPURENT_CHECKPOINT_DIR`
    /// and `GPURENT_RESERVATION_ID` are set): for checkpoints kept in object storage.
    #[arg(long, value_name = "COMMAND")]
    pub checkpoint_hook: Option<String>,
    /// Days a checkpoint volume no instance uses is kept (removed when the agent starts).
    #[arg(long, value_name = "DAYS", default_value_t = 7)]
    pub checkpoint_keep_days: u64,
    /// Seconds a share may use more GPU memory than it has (or an instance keep processes on
    /// a GPU not its own) before the agent stops it, ending it with `vram_exceeded` (0: at
    /// once). Checked on every telemetry sample (each heartbeat).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub vram_grace_secs: u64,
    /// The node runs NVIDIA's MPS control daemon (`nvidia-cuda-mps-control -d`): shares get
    /// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE. The agent
    /// refuses to start when the daemon does not answer within 2 s.
    #[arg(long)]
    pub mps: bool,
}

/// Node liveness: agents sync every heartbeat; a node that misses this many in a row (the
/// node TTL) is `lost`, its work billed up to then and rescheduled on other nodes.
#[derive(Debug, Clone, Args)]
pub struct LivenessArgs {
    /// Milliseconds between an agent's heartbeats (its syncs with the control plane).
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub heartbeat_ms: u64,
    /// Heartbeats a node may miss before the control plane fences it as lost.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub missed_heartbeats: u32,
}

impl LivenessArgs {
    pub fn heartbeat(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.heartbeat_ms.max(1))
    }

    /// How long a node may go unheard before it is lost.
    pub fn node_ttl(&self) -> std::time::Duration {
        self.heartbeat()
            .saturating_mul(self.missed_heartbeats.max(1))
    }

    /// The agent's default lease: half a heartbeat less than the node TTL (but at least one
    /// heartbeat), so that a cut-off agent has stopped its work before the control plane
    /// starts it elsewhere, while a sync held in a long poll (three quarters of a heartbeat)
    /// never runs into it.
    pub fn default_lease(&self) -> std::time::Duration {
        self.node_ttl()
            .saturating_sub(self.heartbeat() / 2)
            .max(self.heartbeat())
    }
}

/// Elastic capacity: a policy over the fleet's figures that calls a hook to add or remove
/// nodes (scale out when CPU > 70% and GPU allocation > 85% for 3 evaluations, or a reservation
/// queued over 60 s; scale in below 30% and 30% for 10). Off unless a hook is given.
#[derive(Debug, Clone, Args)]
pub struct ScaleArgs {
    /// Run with `sh -c` on each scale action: the action as JSON on stdin,
    /// GPURENT_SCALE_ACTION=scale-out|scale-in in the environment, killed after 30 s.
    #[arg(long, value_name = "CMD")]
    pub scale_hook_command: Option<String>,
    /// POST each scale action as JSON to this URL.
    #[arg(long, value_name = "URL")]
    pub scale_hook_url: Option<String>,
    /// Seconds between evaluations of the scale policy.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub scale_interval: u64,
    /// Never ask to scale in at or below this many live nodes.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub scale_min_nodes: u32,
}

/// Where `up` serves SSH unless told otherwise (the contract's default).
pub const DEFAULT_SSH_LISTEN: &str = "127.0.0.1:2222";

/// `--ssh-listen`: an address, or `off` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SshListen(pub Option<SocketAddr>);

fn parse_ssh_listen(text: &str) -> Result<SshListen, String> {
    if text == "off" {
        return Ok(SshListen(None));
    }
    text.parse()
        .map(|addr| SshListen(Some(addr)))
        .map_err(|e| format!("{e}: give HOST:PORT (e.g. 127.0.0.1:2222) or off"))
}

#[derive(Debug, Args)]
pub struct UpArgs {
    #[arg(long, default_value = "./gpurent-data")]
    pub data_dir: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The SSH endpoint (`ssh -p PORT RESERVATION_ID@HOST`), or `off`. When the default port
    /// is taken (a second `up` on this machine) `up` warns and runs without it.
    #[arg(long, value_name = "HOST:PORT|off", default_value = DEFAULT_SSH_LISTEN, value_parser = parse_ssh_listen)]
    pub ssh_listen: SshListen,
    /// The host (and port) tenants are told to connect to for SSH (`get`, `ssh-config`,
    /// `GET /api/v1/ssh`), behind NAT or a load balancer (default: the host they reached the
    /// API at, and the --ssh-listen port).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub ssh_advertise: Option<gpurent_server::ssh::Advertise>,
    /// A TOML price file (currency = "CNY"; [gpu] "MODEL" = "PRICE PER HOUR"; per_gb_hour =
    /// "..."; [shares] premium_percent; [stepped] first_percent, then_percent; see
    /// deploy/prices/seeds-cny.toml); what it does not name keeps its default.
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// Seconds a reservation made with `--queue` may wait for GPUs before it ends as `failed`
    /// (`queue_timeout`), its hold released.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
    pub queue_timeout: u64,
    /// Serve the local agent's GPU metrics at http://HOST:PORT/metrics (default: off; the
    /// control plane's own are at /metrics on --listen).
    #[arg(long, value_name = "HOST:PORT")]
    pub agent_metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub tls: Box<ServerTlsArgs>,
    #[command(flatten)]
    pub scale: ScaleArgs,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub access: AccessArgs,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub liveness: LivenessArgs,
    #[command(flatten)]
    pub keys: KeysArgs,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// Host verification and GPU health: what a node must pass before it gets work (`gpurent nodes
/// ls` shows each check and breach, `gpurent events` when they change).
#[derive(Debug, Args)]
pub struct HostArgs {
    /// Oldest NVIDIA driver accepted, e.g. 550.54.15 (default: any).
    #[arg(long, value_name = "VERSION")]
    pub min_driver: Option<String>,
    /// Oldest CUDA version accepted, e.g. 12.4 (default: any).
    #[arg(long, value_name = "VERSION")]
    pub min_cuda: Option<String>,
    /// Free disk a node's agent data directory must have.
    #[arg(long, value_name = "GIB", default_value_t = 10)]
    pub min_disk_free_gb: u64,
    /// GPU health: a GPU at or above this temperature keeps its node out of placement.
    #[arg(long, value_name = "CELSIUS", default_value_t = 85)]
    pub max_gpu_temp: u32,
    /// GPU health: a GPU with at least this share of its memory in use does too.
    #[arg(long, value_name = "PERCENT", default_value_t = 95)]
    pub max_vram_pct: u32,
    /// Stop a running reservation whose GPUs have been idle (zero utilisation) this long,
    /// unless it was made with `--no-idle-reclaim`; 0 never stops any.
    #[arg(long, value_name = "MINUTES", default_value_t = 5)]
    pub idle_reclaim_minutes: u64,
    /// POST every event (`gpurent events`: GPU health breaches and recoveries) to this URL as
    /// JSON (http://).
    #[arg(long, value_name = "URL")]
    pub alert_webhook: Option<String>,
}

/// Sessions, rate limits and per-tenant caps.
#[derive(Debug, Args)]
pub struct AccessArgs {
    /// How long a password login's session token is valid.
    #[arg(long, value_name = "HOURS", default_value_t = 12)]
    pub session_hours: u32,
    /// Requests per second per API token (bursts of twice as many); 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub rate_limit_per_token: u32,
    /// Requests per second per client address (bursts of twice as many); 0: no limit.
    /// Behind a proxy every client has the proxy's address: raise it or turn it off there.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub rate_limit_per_address: u32,
    /// Most live reservations of one tenant (an admin can set a tenant's own with
    /// `PATCH /api/v1/users/ID`); 0: no cap.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub max_reservations_per_tenant: u32,
    /// Most spend per hour of one tenant: the sum of its live reservations' price_per_hour.
    #[arg(long, value_name = "AMOUNT", default_value = "80.00")]
    pub max_spend_per_hour: gpurent_types::Money,
}

/// What one client may take of the API listener: timeouts for clients slow to send, and caps
/// on open connections. A handler that works long (an agent's long poll, `logs --follow`) is
/// never cut; only a client that is slow to send its request is.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Where other replicas reach this one (on PostgreSQL, to relay SSH channels to the
    /// agents connected here): http(s)://HOST:PORT. Default: the --listen address when it is
    /// a specific one.
    #[arg(long, value_name = "URL")]
    pub advertise_url: Option<String>,
    /// Also serve each published HTTP port at its own host, `ID-PORT.DOMAIN` (the app at the
    /// root of its own origin). Needs a wildcard DNS name `*.DOMAIN` pointing here and, over
    /// TLS, a certificate for it. Default: only at `/proxy/ID/PORT/`.
    #[arg(long, value_name = "DOMAIN")]
    pub proxy_domain: Option<String>,
    /// Seconds a new connection has for its TLS handshake and first request header, and a
    /// request for its header from its first byte; then it is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub header_timeout_secs: u64,
    /// Seconds a request has for its whole body after its header, plus one for each KiB
    /// received (a steady upload on a thin link keeps going); then it is answered 408 and
    /// closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub body_timeout_secs: u64,
    /// Seconds a kept-alive connection may wait for its next request; then it is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub idle_timeout_secs: u64,
    /// Most open connections in all; more are answered 503 and closed at once. Default: the
    /// open-files limit (raised to its hard limit at start) less 256, at most 50,000.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most open connections from one client address (an IPv6 /64 counts as one); more are
    /// answered 503 and closed at once; 0: no cap. Behind a proxy every client has the
    /// proxy's address: raise it or turn it off there.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_connections_per_ip: usize,
}

impl HttpArgs {
    pub fn limits(&self) -> gpurent_server::HttpLimits {
        use std::time::Duration;
        // A zero timeout would close every connection at once: at least a second (and at
        // most a day).
        let secs = |s: u64| Duration::from_secs(s.clamp(1, 86_400));
        gpurent_server::HttpLimits {
            header_timeout: secs(self.header_timeout_secs),
            body_timeout: secs(self.body_timeout_secs),
            idle_timeout: secs(self.idle_timeout_secs),
            max_connections: self.max_connections.map(|n| n.max(1)),
            max_connections_per_ip: (self.max_connections_per_ip > 0)
                .then_some(self.max_connections_per_ip),
        }
    }
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The SSH endpoint (`ssh -p PORT RESERVATION_ID@HOST`); off unless given.
    #[arg(long, value_name = "HOST:PORT|off", default_value = "off", value_parser = parse_ssh_listen)]
    pub ssh_listen: SshListen,
    /// The host (and port) tenants are told to connect to for SSH (`get`, `ssh-config`,
    /// `GET /api/v1/ssh`), behind NAT or a load balancer (default: the host they reached the
    /// API at, and the --ssh-listen port).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub ssh_advertise: Option<gpurent_server::ssh::Advertise>,
    /// sqlite://PATH (default: DATA_DIR/gpurent.db) or postgres://...
    #[arg(long, env = "GPURENT_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    #[arg(long, default_value = "./gpurent-data")]
    pub data_dir: PathBuf,
    /// A TOML price file (see `gpurent up --help`).
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// Seconds a reservation made with `--queue` may wait for GPUs before it ends as `failed`
    /// (`queue_timeout`), its hold released.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
    pub queue_timeout: u64,
    #[command(flatten)]
    pub tls: Box<ServerTlsArgs>,
    #[command(flatten)]
    pub scale: ScaleArgs,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub access: AccessArgs,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub liveness: LivenessArgs,
    #[command(flatten)]
    pub keys: KeysArgs,
}

/// The control plane's keys: the audit trail's signing key (and how long the trail is kept)
/// and the master key that seals tenants' secrets; and how long reservations' output is kept.
#[derive(Debug, Args)]
pub struct KeysArgs {
    /// The master key (64 hex characters) that seals tenants' secrets at rest (envelope
    /// encryption: it wraps a data key per reservation). Default: DATA_DIR/master.key, made on
    /// first start (mode 0600); `GPURENT_MASTER_KEY` in the environment wins over both. Back it
    /// up: sealed secrets cannot be opened without it.
    #[arg(long, value_name = "FILE")]
    pub master_key_file: Option<PathBuf>,
    /// The Ed25519 key (hex seed) that signs the trail's checkpoints (default:
    /// DATA_DIR/audit.key, made on first start, mode 0600). Keep a copy of its public key
    /// (logged at start, and in `gpurent audit verify`) where the database's admins cannot
    /// change it.
    #[arg(long, value_name = "FILE")]
    pub audit_key: Option<PathBuf>,
    /// Days audit records are kept (at least 365); older ones are pruned in whole
    /// checkpointed segments.
    #[arg(long, value_name = "DAYS", default_value_t = 365,
        value_parser = clap::value_parser!(u32).range(365..))]
    pub audit_retention_days: u32,
    /// Days a reservation's output (`gpurent logs`) is kept after it ended; then it is
    /// pruned. Download it before: `gpurent logs ID --out FILE`.
    #[arg(long, value_name = "DAYS", default_value_t = 30,
        value_parser = clap::value_parser!(u32).range(1..))]
    pub log_retention_days: u32,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Join token from `gpurent nodes join-token`; not needed once the node is registered.
    #[arg(long, env = "GPURENT_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    #[arg(long, default_value = "./gpurent-agent")]
    pub data_dir: PathBuf,
    /// Node name (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// Serve this node's GPU and reservation metrics (Prometheus text, dcgm-exporter's names)
    /// at http://HOST:PORT/metrics (default: off).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub liveness: LivenessArgs,
    #[command(flatten)]
    pub node: NodeArgs,
}

#[derive(Debug, Subcommand)]
pub enum UsersCommand {
    /// Create a user; prints its token once.
    Create {
        name: String,
        #[arg(long, default_value = "tenant")]
        role: String,
        /// Initial prepaid credit, e.g. 100 or 12.50.
        #[arg(long)]
        credit: Option<String>,
    },
    /// List users.
    Ls,
    /// Set a console password (your own, or as an admin anyone's); read from the
    /// GPURENT_PASSWORD environment variable, else one line of stdin.
    Passwd {
        /// Whose (default: yours).
        user_id: Option<String>,
    },
    /// Set a tenant's own caps (admin).
    Limits {
        user_id: String,
        /// Most live reservations at once.
        #[arg(long)]
        max_reservations: Option<u32>,
        /// Most spend per hour of its live reservations, e.g. 120.00.
        #[arg(long)]
        max_spend_per_hour: Option<String>,
    },
    /// Give a user another role (admin); the last admin cannot lose its own.
    Role {
        user_id: String,
        #[arg(value_parser = ["tenant", "host", "admin"])]
        role: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create an API token for yourself; prints it once.
    Create {
        /// A label for `tokens ls`.
        #[arg(long)]
        name: Option<String>,
        /// Valid for this many days, and never longer than the token you make it with
        /// (default: as long as that token; until revoked only for an admin or with
        /// `--with-password`). Revoking that token revokes this one.
        #[arg(long, value_name = "N")]
        expires_in_days: Option<u32>,
        /// Give your password (GPURENT_PASSWORD, else a line on stdin): the token is then
        /// one of its own, which may never expire and outlives the token you used.
        #[arg(long)]
        with_password: bool,
    },
    /// Your tokens (admin: everyone's), never their secrets.
    Ls,
    /// Revoke a token by its id: your own (admin: any).
    Revoke { id: String },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Add an OpenSSH public key (a .pub file, or - for stdin): ed25519, ECDSA, or RSA of at
    /// least 3072 bits.
    Add {
        file: std::path::PathBuf,
        /// A label for `keys ls` (default: the key's comment).
        #[arg(long)]
        name: Option<String>,
    },
    /// Your keys (admin: everyone's), with their fingerprints as `ssh-keygen -lf` prints them.
    Ls,
    /// Remove a key by its id: it gets into nothing from now on.
    Rm { id: String },
}

#[derive(Debug, Subcommand)]
pub enum CreditCommand {
    /// Grant prepaid credit to a user.
    Grant {
        user_id: String,
        amount: String,
        /// Makes a retried grant apply once.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Recompute every balance from the transfers; exit 1 when the ledger is broken.
    LedgerCheck,
    /// How spot instances ended: the spot success rate.
    Spot,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the whole retained trail: its hash chain, its signed checkpoints and its head.
    /// Names the first record altered, removed or reordered; exit 1 when not ok.
    Verify,
    /// Records by user, resource and time, as a table (or a JSON array).
    Ls(AuditFilterArgs),
    /// Every matching record as JSON lines (to FILE, or stdout).
    Export {
        #[command(flatten)]
        filter: AuditFilterArgs,
        /// Write here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct AuditFilterArgs {
    /// Only this user's requests (a user id, or node:ID).
    #[arg(long)]
    pub user: Option<String>,
    /// Only requests on this path, or on any path containing this (a reservation id).
    #[arg(long)]
    pub resource: Option<String>,
    /// At or after this time (RFC 3339, or YYYY-MM-DD for midnight UTC).
    #[arg(long)]
    pub from: Option<String>,
    /// Before this time (RFC 3339, or YYYY-MM-DD).
    #[arg(long)]
    pub to: Option<String>,
    /// At most this many records (ls only; default 100).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// Per tenant, node and GPU: GPU-hours, VRAM-hours, revenue and utilisation (CSV, JSON),
    /// a VRAM heat map (GPU x hour) and a reservation timeline (PNG and SVG), into DIR.
    Daily {
        /// The UTC day, YYYY-MM-DD.
        #[arg(long, value_parser = parse_date)]
        date: chrono::NaiveDate,
        /// The directory to write the files into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Spot, on-demand, stepped and reserved compared over seven UTC days: GPU-hours, cost,
    /// price per GPU-hour, preemptions and the platform's return.
    Weekly {
        /// The ISO week, YYYY-Www (default: the last whole week).
        #[arg(long, value_parser = parse_week, conflicts_with = "from")]
        week: Option<String>,
        /// Or the first of the seven days, YYYY-MM-DD.
        #[arg(long, value_parser = parse_date)]
        from: Option<chrono::NaiveDate>,
        /// Also write weekly.csv and weekly.json into DIR.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

fn parse_date(s: &str) -> Result<chrono::NaiveDate, String> {
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .filter(|_| s.len() == 10)
        .ok_or_else(|| format!("{s:?} is not a date YYYY-MM-DD"))
}

fn parse_week(s: &str) -> Result<String, String> {
    let bad = || format!("{s:?} is not an ISO week YYYY-Www");
    let (year, week) = s.split_once("-W").ok_or_else(bad)?;
    let year: i32 = year
        .parse()
        .ok()
        .filter(|_| year.len() == 4)
        .ok_or_else(bad)?;
    let week: u32 = week
        .parse()
        .ok()
        .filter(|_| week.len() == 2)
        .ok_or_else(bad)?;
    chrono::NaiveDate::from_isoywd_opt(year, week, chrono::Weekday::Mon).ok_or_else(bad)?;
    Ok(s.to_owned())
}

#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// Make a token for `gpurent agent --join-token`.
    JoinToken,
    /// List nodes and their GPUs.
    Ls,
    /// No new work on this node (by name or id); what runs there keeps running.
    Cordon { node: String },
    /// Cordon the node and move what runs there to other nodes (each billed here to now, and
    /// from when it runs there).
    Drain { node: String },
    /// Let the node take new work again.
    Uncordon { node: String },
    /// Revoke the node's certificate (by name or id): its agent is refused from now on, the
    /// node is lost after its TTL and its work rescheduled elsewhere.
    Revoke { node: String },
}

#[derive(Debug, Args)]
pub struct ReserveArgs {
    /// GPU type, e.g. rtx4090 or "RTX 4090".
    #[arg(long)]
    pub gpu: String,
    /// Whole GPUs on one node.
    #[arg(long, conflicts_with_all = ["vram_gb", "vram_fraction"])]
    pub count: Option<u32>,
    /// A share of one GPU with this much memory, up to all of it (24 on a 24 GB card).
    #[arg(long, conflicts_with = "vram_fraction")]
    pub vram_gb: Option<u32>,
    /// A share of one GPU as a fraction of its memory, more than 0 and at most 1 (0.5: half).
    #[arg(long, value_name = "FRACTION")]
    pub vram_fraction: Option<f64>,
    /// How long it may run, e.g. 1 or 0.5.
    #[arg(long)]
    pub hours: f64,
    #[arg(long)]
    pub tier: Option<String>,
    /// Highest price per hour, for spot.
    #[arg(long)]
    pub bid: Option<String>,
    #[arg(long)]
    pub image: Option<String>,
    /// Environment variables, K=V.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// A port of the instance to publish on its node (Docker executor); repeatable.
    #[arg(long = "port", short = 'p', value_name = "PORT")]
    pub ports: Vec<u16>,
    /// A port of the instance to reach over HTTP through the control plane, at
    /// `/proxy/ID/PORT/`, for you only (`gpurent open ID PORT`); repeatable, at most 8.
    #[arg(long = "http-port", value_name = "PORT")]
    pub http_ports: Vec<u16>,
    /// When nothing fits now, wait in the queue (status `pending`, no node) instead of
    /// failing with no_capacity; the first hour is held meanwhile, and released if it is
    /// stopped or times out before it runs.
    #[arg(long)]
    pub queue: bool,
    /// When its node is lost: run it again on another node from its image (`reschedule`),
    /// or end it as `lost` (`stop`).
    #[arg(long, value_enum, default_value = "reschedule")]
    pub on_node_loss: OnNodeLossArg,
    /// Keep it running even when its GPUs stay idle (by default it is stopped after the
    /// platform's idle time, `--idle-reclaim-minutes` of `up`/`server`, 5).
    #[arg(long)]
    pub no_idle_reclaim: bool,
    /// A secret environment variable for the instance, its value taken from this command's
    /// own environment variable of that name (never from the command line): kept encrypted,
    /// never shown again. Repeatable.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Give the instance a checkpoint volume (`$GPURENT_CHECKPOINT_DIR`, `/checkpoint` in a
    /// container) that a rescheduled run finds again, on nodes that share checkpoint storage.
    #[arg(long)]
    pub checkpoint: bool,
    /// Makes a retried reservation happen once.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `gpurent instance-sftp`: where the SFTP helper serves an instance.
#[derive(Debug, clap::Args)]
pub struct InstanceSftpArgs {
    /// A process of the instance whose mount namespace and root to enter (none: the node's).
    #[arg(long)]
    pub pid: Option<i32>,
    /// The uid to become (none: stay as started).
    #[arg(long)]
    pub uid: Option<u32>,
    /// The gid to become (default: the uid).
    #[arg(long)]
    pub gid: Option<u32>,
    /// Where relative paths start (`/` where it does not exist).
    #[arg(long, default_value = "/")]
    pub home: PathBuf,
}

#[derive(Debug, Args)]
pub struct SshArgs {
    /// The reservation.
    pub id: String,
    /// The private key to log in with (default: ssh's own choice: its agent, ~/.ssh/id_*).
    #[arg(short = 'i', long = "identity", value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// The command to run instead of a shell, after `--`; its exit status is this command's.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SshConfigArgs {
    /// Only this reservation (default: every running one of yours).
    pub id: Option<String>,
    /// An `IdentityFile` line in each block (and `IdentitiesOnly yes`).
    #[arg(short = 'i', long = "identity", value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// Write the blocks to the CLI's own ssh_config (~/.config/gpurent/ssh_config, replaced
    /// each time) instead of printing them, and put an `Include` of it at the top of
    /// ~/.ssh/config if it is not there yet (the rest of that file is kept as it is).
    #[arg(long)]
    pub write: bool,
}

/// How gpurent's own SSH client logs in, and (hidden, for tests and for any OpenSSH server)
/// where it connects without asking the control plane.
#[derive(Debug, Clone, Args)]
pub struct SshClientArgs {
    /// The private key to log in with (default: the keys of ssh-agent at SSH_AUTH_SOCK, then
    /// ~/.ssh/id_ed25519, id_ecdsa, id_rsa).
    #[arg(short = 'i', long = "identity", value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// Connect to this SSH server (HOST:PORT) instead of the control plane's endpoint; the
    /// reservation id is then the SSH user.
    #[arg(
        long,
        value_name = "HOST:PORT",
        hide = true,
        requires = "direct_host_key"
    )]
    pub direct: Option<String>,
    /// The host key (an OpenSSH .pub file) that the `--direct` server must have.
    #[arg(long, value_name = "FILE", hide = true, requires = "direct")]
    pub direct_host_key: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CpArgs {
    /// What to copy: a local path, or ID:PATH in a reservation.
    pub src: String,
    /// Where to: a local path, or ID:PATH (a directory: into it, under the source's name).
    pub dst: String,
    /// Copy a directory and everything in it.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    #[command(flatten)]
    pub ssh: SshClientArgs,
}

#[derive(Debug, Args)]
pub struct PortForwardArgs {
    /// The reservation.
    pub id: String,
    /// `[LOCAL:]REMOTE`: the port inside the instance, and the one on 127.0.0.1 (default: the
    /// same; 0: any free one, printed).
    pub ports: String,
    #[command(flatten)]
    pub ssh: SshClientArgs,
}
