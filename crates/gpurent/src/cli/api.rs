//! The API commands (users, credit, reservations, nodes, reports, the audit trail, ...) and
//! their arguments: each is a request to the control plane.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

/// The commands that ask the control plane's API (and `openapi`, which prints its document).
#[derive(Debug, Subcommand)]
pub enum ApiCommand {
    /// Manage users (admin).
    #[command(subcommand)]
    Users(UsersCommand),
    /// Prepaid credit: grant it (admin), move yours into a team.
    #[command(subcommand)]
    Credit(CreditCommand),
    /// API tokens: create with an expiry, list, revoke.
    #[command(subcommand)]
    Tokens(super::TokensCommand),
    /// Your SSH public keys, for `ssh RESERVATION_ID@HOST`: add, list, remove.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Volumes: storage that outlives instances (`reserve --volume NAME:/workspace`).
    #[command(subcommand)]
    Volumes(super::VolumesCommand),
    /// Endpoints: an app behind one URL, its replicas scaled with its traffic (to zero).
    #[command(subcommand)]
    Endpoints(super::EndpointsCommand),
    /// Templates: named instance setups that `reserve --template NAME` starts from.
    #[command(subcommand)]
    Templates(super::TemplatesCommand),
    /// Your credentials for private image registries, used for your pulls only.
    #[command(subcommand)]
    Registries(super::RegistriesCommand),
    /// Teams: a shared balance, members with roles, reservations made for the team.
    #[command(subcommand)]
    Teams(super::TeamsCommand),
    /// Monthly budgets: alerts on the way, a refusal (and stops, if asked) at the limit.
    #[command(subcommand)]
    Budget(super::BudgetCommand),
    /// Webhooks for your events (or a team's), signed with HMAC-SHA256 and retried for a day.
    #[command(subcommand)]
    Notifications(super::NotificationsCommand),
    /// GPU quotas per team: guaranteed GPUs of a type, and borrowing beyond them.
    #[command(subcommand)]
    Quotas(super::QuotasCommand),
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
        /// Whose invoice, by user id (admin).
        #[arg(long, conflicts_with = "team")]
        user: Option<String>,
        /// A team of yours.
        #[arg(long, value_name = "NAME")]
        team: Option<String>,
    },
    /// What your nodes earned, per node (hosts).
    Earnings(Window),
    /// Reserve GPUs.
    #[command(after_help = "Guide: docs/tenants.md (tiers, prices, queueing, images, ports).")]
    Reserve(Box<ReserveArgs>),
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
    /// Checks of the platform's books, backups and restores (admin).
    #[command(
        subcommand,
        after_help = "Guide: docs/operators.md; backups and restores: docs/operations.md."
    )]
    Admin(AdminCommand),
    /// Usage reports (admin): a day as CSV, JSON and charts, a week per price tier.
    #[command(subcommand)]
    Report(ReportCommand),
    /// The audit trail of every API request (admin): verify, search, export.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Print the OpenAPI document of the HTTP API.
    Openapi,
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
    /// GPURENT_PASSWORD environment variable, else one line of stdin. Changing your own needs
    /// the current one in GPURENT_CURRENT_PASSWORD, and ends your other login sessions.
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
pub enum CreditCommand {
    /// Grant prepaid credit to a user or a team, by id (admin).
    Grant {
        user_id: String,
        amount: String,
        /// Makes a retried grant apply once.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Move your own credit into a team's balance (an owner of the team).
    Move {
        amount: String,
        #[arg(long, value_name = "TEAM")]
        to_team: String,
        /// Makes a retried move apply once.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
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

/// A statement's time window and whose it is.
#[derive(Debug, Args)]
pub struct Window {
    /// Start, YYYY-MM-DD or RFC 3339 (default: the beginning).
    #[arg(long)]
    pub from: Option<String>,
    /// End, exclusive (default: now).
    #[arg(long)]
    pub to: Option<String>,
    /// Whose statement, by user id (admin; default: yours).
    #[arg(long, conflicts_with = "team")]
    pub user: Option<String>,
    /// A team of yours (a member of any role; default: yours, or the team your token acts
    /// for).
    #[arg(long, value_name = "NAME")]
    pub team: Option<String>,
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
    /// The image to run (Docker executor); without one, an isolated process.
    #[arg(long)]
    pub image: Option<String>,
    /// Start from a template (`gpurent templates ls`: yours, or a public one such as shell,
    /// jupyter, pytorch): its image, command, environment and HTTP ports, each overridden by
    /// the flag given here (`--env` adds to its environment); `--volume NAME` without a path
    /// goes to its volume mount.
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// Make it for a team you are a member of (`gpurent teams ls`): paid from the team's
    /// balance, seen by its members, stopped by its members and above.
    #[arg(long, value_name = "NAME")]
    pub team: Option<String>,
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
    /// A managed job: start its run again when it is interrupted (preempted, its node lost or
    /// drained: `on-interruption`), also when it fails (`on-failure`), or also when it exits 0
    /// (`always`). It goes back to the queue with the same id; the wait is not billed.
    #[arg(long, value_name = "POLICY", value_parser = ["never", "on-failure", "on-interruption", "always"])]
    pub restart: Option<String>,
    /// How many failed runs (with `always`, finished ones too) are started again, each after
    /// a back-off from 5 s doubling to 5 min, before the job ends with the last one's reason
    /// (default 3, at most 100).
    #[arg(long, value_name = "N")]
    pub max_restarts: Option<u32>,
    /// A volume of yours mounted read-write at /checkpoint in every run
    /// (`$GPURENT_CHECKPOINT_DIR`): where a restarted run finds what the last one saved.
    #[arg(long, value_name = "NAME")]
    pub checkpoint_volume: Option<String>,
    /// A job array: FIRST-LAST[%LIMIT], as 0-999%50: one task of this shape per index, each
    /// with `$GPURENT_ARRAY_INDEX`, at most LIMIT (1,000 without one) queued or running at
    /// once. One id for the array; ID[INDEX] names a task for get, logs, stop, ssh and cp.
    #[arg(long, value_name = "SPEC")]
    pub array: Option<String>,
    /// A volume to mount, NAME:PATH or NAME:PATH:ro (`gpurent volumes create`), or NAME alone
    /// with a template that has a volume mount; repeatable.
    /// A volume is mounted read-write by one reservation at a time, read-only by any number;
    /// a node-local one places the reservation on its node.
    #[arg(long = "volume", short = 'v', value_name = "NAME[:PATH[:ro]]")]
    pub volumes: Vec<String>,
    /// Makes a retried reservation happen once.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// The command to run, after `--`; the reservation ends when it does. Without one, an
    /// interactive instance: with `--image`, the image's own command; without, one that stays
    /// up for its hours, to enter with `gpurent ssh ID`, `cp`, `port-forward` or the console's
    /// terminal.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnNodeLossArg {
    Reschedule,
    Stop,
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

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Recompute every balance from the transfers; exit 1 when the ledger is broken.
    LedgerCheck,
    /// How spot instances ended: the spot success rate.
    Spot,
    /// Copy the control plane, while it runs, into FILE: the database as of one commit and the
    /// data dir's keys (master key, admin token, TLS). FILE holds secrets (mode 0600). Local:
    /// reads the data dir or database, needs no token.
    Backup(BackupArgs),
    /// Restore a backup into a data dir (and with --database-url into an empty PostgreSQL
    /// database); then start `up` or `server` on it. Refused while a server runs on the dir.
    Restore(RestoreArgs),
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The backup file to write (replaced atomically when it exists).
    pub file: PathBuf,
    /// The control plane's data dir.
    #[arg(long, default_value = "./gpurent-data")]
    pub data_dir: PathBuf,
    /// sqlite://PATH (default: DATA_DIR/gpurent.db) or postgres://... (one host; a standby's
    /// is best).
    #[arg(long, env = "GPURENT_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// The master key, when it is not DATA_DIR/master.key (`GPURENT_MASTER_KEY` wins).
    #[arg(long, value_name = "FILE")]
    pub master_key_file: Option<PathBuf>,
    /// The directory of pg_dump and pg_restore (default: the PATH's).
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup file (from `gpurent admin backup`).
    pub file: PathBuf,
    /// The data dir to restore into (made when missing).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// For a PostgreSQL backup: the empty database to restore into.
    #[arg(long, env = "GPURENT_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Replace the database and keys that the data dir (or database) already holds.
    #[arg(long)]
    pub force: bool,
    /// The directory of pg_restore (default: the PATH's).
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<PathBuf>,
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
