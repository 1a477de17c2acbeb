//! `gpurent endpoints`: an app served behind one stable URL by replicas that scale with its
//! traffic, and its arguments.

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum EndpointsCommand {
    /// Make an endpoint: replicas of one shape (each a reservation, billed as one while it
    /// runs) started by its traffic, to zero when nobody calls it.
    #[command(
        after_help = "Example:\n  gpurent endpoints create chat --gpu rtx4090 --image vllm/vllm-openai --port 8000 \\\n    \
                      --max-replicas 2 --scale-down-after 5m\n  \
                      gpurent endpoints keys create chat"
    )]
    Create(Box<EndpointCreateArgs>),
    /// Your endpoints: state, ready and total replicas, URL.
    Ls,
    /// One endpoint: its settings, replicas and figures.
    Get { name: String },
    /// Change an endpoint; only the flags given change. A new image, command or environment
    /// rolls the replicas over (a new one passes its health check before an old one stops).
    Update(Box<EndpointUpdateArgs>),
    /// Remove an endpoint; its replicas stop and its keys stop working.
    Rm { name: String },
    /// A replica's log (by default the newest running one).
    Logs {
        name: String,
        /// The replica with this index (as `endpoints get` lists them).
        #[arg(long, value_name = "N")]
        replica: Option<u64>,
        /// Keep printing until the replica ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// An endpoint's API keys: what clients send as `Authorization: Bearer KEY`.
    #[command(subcommand)]
    Keys(EndpointKeysCommand),
}

#[derive(Debug, Subcommand)]
pub enum EndpointKeysCommand {
    /// Make a key; it is printed once, never shown again.
    Create { name: String },
    /// An endpoint's keys, by id and first characters.
    Ls { name: String },
    /// Revoke a key: requests with it are refused from now on.
    Rm {
        name: String,
        #[arg(value_name = "KEY_ID")]
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct EndpointCreateArgs {
    /// Its name, the first label of its URL: lowercase letters, digits and `-`, at most 40.
    pub name: String,
    /// GPU type of each replica, e.g. rtx4090 or "RTX 4090".
    #[arg(long)]
    pub gpu: String,
    /// Whole GPUs per replica (default 1).
    #[arg(long, conflicts_with = "vram_gb")]
    pub count: Option<u32>,
    /// A share of one GPU with this much memory, per replica.
    #[arg(long)]
    pub vram_gb: Option<u32>,
    /// The image each replica runs (Docker executor); without one, the command after `--` as
    /// an isolated process.
    #[arg(long)]
    pub image: Option<String>,
    /// Take the image, command and environment from a template (`gpurent templates ls`).
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// The port the app listens on inside each replica.
    #[arg(long)]
    pub port: u16,
    /// Replicas kept however quiet it is; 0 scales to zero.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub min_replicas: u32,
    /// The most replicas at once.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub max_replicas: u32,
    /// Requests in flight per replica that scaling aims at.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub target_inflight: u32,
    /// How long below the target before a replica is stopped: 90, 90s, 5m, 1h.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub scale_down_after: String,
    /// The path polled until a new replica answers 2xx.
    #[arg(long, default_value = "/health", value_name = "PATH")]
    pub health_path: String,
    /// The price tier of its replicas (as `reserve --tier`: on-demand, spot, ...).
    #[arg(long)]
    pub tier: Option<String>,
    /// Anyone may call it, without a key.
    #[arg(long)]
    pub public: bool,
    /// How long a request waits for a replica before 503: 90, 90s, 5m, 1h.
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    pub queue_timeout: String,
    /// Past this many waiting requests, new ones get 429 at once.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_queue: u32,
    /// The largest request body, in MiB (413 beyond).
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    pub max_body_mb: u32,
    /// Environment variables of each replica, K=V; repeatable.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// The command each replica runs, after `--` (with `--image`: instead of the image's own).
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct EndpointUpdateArgs {
    /// The endpoint's name.
    pub name: String,
    /// A new image (rolls the replicas over).
    #[arg(long)]
    pub image: Option<String>,
    /// The whole new environment, K=V, repeatable: it replaces every variable set before
    /// (rolls the replicas over).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Replicas kept however quiet it is; 0 scales to zero.
    #[arg(long, value_name = "N")]
    pub min_replicas: Option<u32>,
    /// The most replicas at once.
    #[arg(long, value_name = "N")]
    pub max_replicas: Option<u32>,
    /// Requests in flight per replica that scaling aims at.
    #[arg(long, value_name = "N")]
    pub target_inflight: Option<u32>,
    /// How long below the target before a replica is stopped: 90, 90s, 5m, 1h.
    #[arg(long, value_name = "DURATION")]
    pub scale_down_after: Option<String>,
    /// The path polled until a new replica answers 2xx.
    #[arg(long, value_name = "PATH")]
    pub health_path: Option<String>,
    /// Whether anyone may call it without a key.
    #[arg(long, value_name = "true|false")]
    pub public: Option<bool>,
    /// How long a request waits for a replica before 503: 90, 90s, 5m, 1h.
    #[arg(long, value_name = "DURATION")]
    pub queue_timeout: Option<String>,
    /// Past this many waiting requests, new ones get 429 at once.
    #[arg(long, value_name = "N")]
    pub max_queue: Option<u32>,
    /// The largest request body, in MiB (413 beyond).
    #[arg(long, value_name = "MIB")]
    pub max_body_mb: Option<u32>,
    /// A new command, after `--` (rolls the replicas over).
    #[arg(last = true)]
    pub command: Vec<String>,
}
