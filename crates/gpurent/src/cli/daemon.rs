//! The daemon commands (`up`, `server`, `agent`, the agent's SFTP helper, `sim`) and their
//! arguments; the benchmarks' are in `bench.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use super::BenchCommand;

/// The commands that run a process of the platform (the control plane, an agent, a helper of
/// the agent's) or run on their own (benchmarks, the simulator). `--help` lists commands in
/// the order they are declared (numbered from 0), clap's `help` last (999): bench and sim
/// stay after the API commands, where they always were.
#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Serves SFTP for an instance on stdin/stdout (the agent runs it for SSH sessions).
    #[command(name = "instance-sftp", hide = true)]
    InstanceSftp(InstanceSftpArgs),
    /// Everything on one machine: control plane on SQLite plus a local node agent.
    #[command(
        after_help = "Guide: README.md (run it), docs/hosts.md and docs/operators.md; \
                            options from a file: docs/configuration.md."
    )]
    Up(Box<UpArgs>),
    /// The control plane only.
    #[command(
        after_help = "Guide: docs/operators.md; options from a file and SIGHUP: \
                            docs/configuration.md; upgrades and backups: docs/operations.md."
    )]
    Server(Box<ServerArgs>),
    /// A node agent on a GPU host.
    #[command(after_help = "Guide: docs/hosts.md; options from a file: docs/configuration.md.")]
    Agent(Box<AgentArgs>),
    /// Check a configuration file, or show the configuration a daemon would run with.
    #[command(
        subcommand,
        display_order = 899,
        after_help = "Guide: docs/configuration.md."
    )]
    Config(super::ConfigCommand),
    /// Benchmarks (see BENCHMARKS.md).
    #[command(subcommand, display_order = 900)]
    Bench(BenchCommand),
    /// Replay a trace through the placement policies (the FGD paper's experiment), offline.
    #[command(display_order = 901)]
    Sim(SimArgs),
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

/// `gpurent instance-sftp`: where the SFTP helper serves an instance.
#[derive(Debug, clap::Args)]
pub struct InstanceSftpArgs {
    /// A process of the instance whose mount namespace and root to enter (none: the node's).
    #[arg(long, conflicts_with = "chroot")]
    pub pid: Option<i32>,
    /// A directory to make the root instead (a volume served with no instance); needs root.
    #[arg(long)]
    pub chroot: Option<PathBuf>,
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
pub struct UpArgs {
    /// Read options from this TOML file (keys: the long flags' names, e.g. `listen =
    /// "0.0.0.0:8080"`); a flag or environment variable overrides it (docs/operators.md).
    #[arg(long, env = "GPURENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
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
    /// Do not install what the process executor needs when it is missing. By default `up`, run
    /// as root, installs bubblewrap (isolation) and passt (instances' own network) with
    /// apt-get, saying so.
    #[arg(long)]
    pub no_install: bool,
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

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Read options from this TOML file (keys: the long flags' names, e.g. `listen =
    /// "0.0.0.0:8080"`); a flag or environment variable overrides it (default:
    /// /etc/gpurent/server.toml when present; docs/operators.md).
    #[arg(long, env = "GPURENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
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
    /// Let tenants' webhooks (`gpurent notifications`) point at private addresses (loopback,
    /// 10/8, 192.168/16, link-local...): only where every tenant may reach this network.
    #[arg(long)]
    pub notifications_allow_private: bool,
    /// Fair share between the tenants in the queue: how fast their past GPU use is forgotten,
    /// in days or hours (`7d`, `36h`; from 1h to 14d).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = half_life)]
    pub fairshare_half_life: std::time::Duration,
}

/// `7d` or `36h`, from an hour to 14 days.
fn half_life(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{text:?} is not a half-life such as 7d or 36h (from 1h to 14d)");
    let t = text.trim();
    let (n, unit) = t.split_at(t.len().saturating_sub(1));
    let n: u64 = n.parse().map_err(|_| bad())?;
    let hours = match unit {
        "d" => n.checked_mul(24).ok_or_else(bad)?,
        "h" => n,
        _ => return Err(bad()),
    };
    if !(1..=14 * 24).contains(&hours) {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs(hours * 3600))
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
    /// The apps' site: browsers reach each published HTTP port at `ID-PORT.DOMAIN`, an origin
    /// of its own that shares no cookie with the console. Beyond one machine give a
    /// registrable domain other than the console's (the console at console.example.com, the
    /// apps under apps.example.net), with a wildcard DNS name `*.DOMAIN` pointing here and,
    /// over TLS, a certificate for it. The default, `localhost`, works in a browser on this
    /// machine (`ID-PORT.localhost` is the loopback; the console is then at 127.0.0.1).
    #[arg(long, value_name = "DOMAIN", alias = "proxy-domain")]
    pub apps_domain: Option<String>,
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

/// The control plane's keys: the audit trail's signing key (and how long the trail is kept)
/// and the master key that seals tenants' secrets; and how long reservations' output is kept.
#[derive(Debug, Args)]
pub struct KeysArgs {
    /// The master key (64 hex characters) that seals tenants' secrets at rest (envelope
    /// encryption: it wraps a data key per reservation) and the keys every replica shares in
    /// the database (node CA, audit key, SSH host key): give each replica the same one.
    /// Default: DATA_DIR/master.key, made on first start (mode 0600); `GPURENT_MASTER_KEY` in
    /// the environment wins over both. Back it up: sealed secrets cannot be opened without it.
    #[arg(long, value_name = "FILE")]
    pub master_key_file: Option<PathBuf>,
    /// An Ed25519 key (hex seed) to sign the trail's checkpoints with, imported into the
    /// database (sealed by the master key) on first start; one that is not the database's is
    /// refused. Default: DATA_DIR/audit.key when there (older versions kept it), else the key in
    /// the database, made on first start and shared by every replica. Keep a copy of its
    /// public key (logged at start, and in `gpurent audit verify`) where the database's admins
    /// cannot change it.
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
    /// Days a tenant whose balance is below zero keeps their volumes' data (still charged);
    /// after that an admin may delete them (`gpurent volumes rm`). Nothing is deleted on its own.
    #[arg(long, value_name = "DAYS", default_value_t = 7,
        value_parser = clap::value_parser!(u32).range(1..=365))]
    pub storage_grace_days: u32,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Read options from this TOML file (keys: the long flags' names, e.g. `listen =
    /// "0.0.0.0:8080"`); a flag or environment variable overrides it (default:
    /// /etc/gpurent/agent.toml when present; docs/operators.md).
    #[arg(long, env = "GPURENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
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
    /// Run the process executor's instances in the node's network instead of a network
    /// namespace of their own each (with pasta): they then reach the node's loopback services
    /// and each other's ports, and `nodes ls` and the offers say `network: shared`. For
    /// comparisons; a host without pasta or network namespaces shares it anyway.
    #[arg(long)]
    pub shared_network: bool,
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
    /// Where tenants' node-local volumes live (default DATA_DIR/volumes): each an ext4 image
    /// of its size, loop-mounted, or a directory with a project quota where this file system
    /// has them. Needs root; `nodes ls` says which, or why none.
    #[arg(long, value_name = "DIR")]
    pub volumes_dir: Option<PathBuf>,
    /// Each instance's own disk (its directory, a container's writable layer), GB per GPU:
    /// a write past it fails with ENOSPC inside the instance, the node untouched (enforced
    /// as volumes are; a container's only where the Docker storage driver can). Default: the
    /// volumes dir's free disk divided among the GPUs, at most 100. 0: unbounded.
    #[arg(long, value_name = "GB")]
    pub disk_per_gpu_gb: Option<u64>,
    /// Storage every node of the shared kind mounts here (NFS, CephFS, any POSIX file
    /// system): tenants' shared volumes, which work on them can use from any such node.
    #[arg(long, value_name = "DIR")]
    pub shared_volumes_dir: Option<PathBuf>,
    /// Images to keep warm: pulled at start where the Engine lacks them (placement prefers
    /// a node that has a reservation's image). Comma-separated, or repeated.
    #[arg(long, value_name = "IMAGE,...", value_delimiter = ',')]
    pub prepull: Vec<String>,
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

#[cfg(test)]
mod tests {
    #[test]
    fn half_lives_are_days_or_hours_within_bounds() {
        assert_eq!(super::half_life("7d").unwrap().as_secs(), 7 * 86_400);
        assert_eq!(super::half_life("36h").unwrap().as_secs(), 36 * 3600);
        for bad in ["", "0h", "15d", "7", "d", "-1d", "1w"] {
            assert!(super::half_life(bad).is_err(), "{bad}");
        }
    }
}
