//! The store's inputs and small outputs: validated intents from the server.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpurent_types::agent::GpuInfo;
use gpurent_types::{GpuType, Money, Role, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The caller of an API request, found by token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUser {
    pub id: String,
    pub name: String,
    pub role: Role,
}

/// Whose reservations a query may see: a tenant its own and its teams', an admin all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// A user's: their own, and those of the teams they are a member of (any role).
    Tenant(String),
    All,
}

impl Scope {
    pub fn of(user: &AuthUser) -> Self {
        match user.role {
            Role::Admin => Scope::All,
            Role::Tenant | Role::Host => Scope::Tenant(user.id.clone()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct NewUser {
    pub name: String,
    pub role: Role,
    pub token_hash: String,
    pub credit: Money,
}

/// A node's client certificate as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCertificate {
    /// The SHA-256 of the certificate signed at registration; `None`: it joined without TLS.
    pub sha256: Option<String>,
    /// An admin revoked it: the node's syncs are refused.
    pub revoked: bool,
}

/// What a sync leaves for its answer, read back by the statement that recorded it: the node's
/// desired-state version and its health as last recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Synced {
    pub desired_version: i64,
    /// The recorded issues as `record_health` writes them (`None`: healthy).
    pub(crate) health: Option<String>,
    /// The desired state (`NodeStore::desired_state`) at `desired_version`, where the sync
    /// read it in the same statement (an idle node's heartbeat on PostgreSQL); else `None`.
    pub desired_state: Option<(i64, Vec<gpurent_types::agent::Assignment>)>,
}

impl Synced {
    /// Whether `issues` are those recorded already: then `record_health` would change nothing
    /// and need not be asked.
    pub fn health_is(&self, issues: &[gpurent_types::api::HealthIssue]) -> bool {
        crate::sql::health_json(issues).ok() == Some(self.health.clone())
    }
}

#[derive(Debug, Clone)]
pub struct NewNode {
    pub join_token_hash: String,
    pub node_token_hash: String,
    pub name: String,
    pub executor: String,
    pub gpu_backend: String,
    pub gpus: Vec<GpuInfo>,
    /// Its host verification, recorded with it so that a node that failed never gets work.
    pub verification: Option<gpurent_types::api::HostVerification>,
    /// Whether its executor isolates instances (`gpurent nodes ls` and the offers say
    /// `unisolated` otherwise).
    pub isolated: bool,
    /// Whether its instances share its network (`network: shared`).
    pub shared_network: bool,
}

/// Whole GPUs or a share of one: the planner's request.
pub use gpurent_sched::Request as Want;

#[derive(Debug, Clone)]
pub struct NewReservation {
    /// Who owns and pays for it: a user, or the team it is made for.
    pub tenant_id: String,
    /// The member who made it, where it is a team's.
    pub created_by: Option<String>,
    pub gpu_type: GpuType,
    pub want: Want,
    pub duration_s: u64,
    pub tier: Tier,
    pub bid: Option<Money>,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub ports: Vec<u16>,
    /// Ports of the instance reachable over HTTP through the control plane's proxy.
    pub http_ports: Vec<u16>,
    /// With `request_hash`: a retried request with the same key returns the first reservation.
    pub idempotency_key: Option<String>,
    pub request_hash: String,
    /// Wait in the queue (`pending`, no node) when nothing fits now, instead of failing with
    /// `NoCapacity`.
    pub queue: bool,
    /// What happens to it when its node is lost.
    pub on_node_loss: gpurent_types::OnNodeLoss,
    /// Stopped when its GPUs have been idle for the platform's idle time.
    pub idle_reclaim: bool,
    /// Its instance gets a checkpoint volume that outlives it.
    pub checkpoint: bool,
    /// Its secret environment variables, sealed by the control plane (the store never sees
    /// them in clear), and their names.
    pub sealed_secrets: Option<String>,
    pub secret_names: Vec<String>,
    /// The platform's caps on the tenant's live reservations, checked in the same
    /// transaction as the insert.
    pub limits: crate::TenantLimits,
    /// The volumes its instance mounts, and where they let it be placed.
    pub mounts: Vec<crate::VolumeMountRow>,
    pub node_filter: crate::NodeFilter,
    /// The endpoint it is a replica of.
    pub replica_of: Option<ReplicaOf>,
    /// The job array it is a task of: the array's id and its index.
    pub array_of: Option<(String, u64)>,
    /// Nodes (by name) it goes to only if no other has room (an endpoint's replicas spread): a
    /// preference of its placement at once, not of the queue's.
    pub avoid_nodes: Vec<String>,
    /// A managed job's restart policy, and how many counted restarts it may have.
    pub restart: gpurent_types::RestartPolicy,
    pub max_restarts: u32,
}

/// Which endpoint a reservation serves, its number there and the generation of the endpoint's
/// spec it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaOf {
    pub endpoint_id: String,
    pub index: u64,
    pub generation: u64,
}

/// What `ReservationStore::reserve_recorded` did.
#[derive(Debug, Clone)]
pub struct Reserved {
    /// Placed, queued, or the earlier one of its Idempotency-Key.
    pub reservation: gpurent_types::api::Reservation,
    /// The nodes whose desired state changed.
    pub nodes: Vec<String>,
    /// The request's audit record was written with it.
    pub recorded: bool,
}

/// A reservation waiting in the queue, as the scheduling pass reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedReservation {
    pub id: String,
    /// The GPU type it waits for (`GpuType::key`).
    pub type_key: String,
    pub want: Want,
    pub tier: Tier,
    /// A spot reservation's priority (its bid per whole GPU-hour, in micro-units).
    pub priority: Option<i64>,
    pub queued_at: DateTime<Utc>,
    pub duration_s: u64,
    /// Where its volumes let it run.
    pub node_filter: crate::NodeFilter,
    /// The node-local volume that ties it to its node, and that node's state when down.
    pub tie: Option<crate::VolumeTie>,
    /// Who pays for it (a user, or a team): its account in fair share.
    pub tenant_id: String,
}

/// What fair share needs of a tenant (a team, or a user: a team of one) with queued work: its
/// weight (the GPUs its quotas guarantee, in milli-GPUs; 0 without a quota) and what its
/// reservations ran lately.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamUsage {
    pub team_id: String,
    pub guaranteed_milli: u64,
    /// Its reservations that ran within [`USAGE_HORIZON_DAYS`], as fair share reads them.
    pub ran: Vec<gpurent_sched::fair_share::Interval>,
}

/// How far back a team's usage is read: past it, a 14-day half-life leaves under 2% of it.
pub const USAGE_HORIZON_DAYS: i64 = 90;

/// A GPU of a live node, with the memory free on it, and its type (`GpuType::key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveGpu {
    pub type_key: String,
    pub gpu: gpurent_sched::plan::Gpu,
}

/// What one scheduling pass reads: the queue, the live GPUs of the types it waits for, and
/// the work holding memory on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueView {
    pub queued: Vec<QueuedReservation>,
    pub gpus: Vec<LiveGpu>,
    /// The placed work holding memory on them (priorities as the planner ranks them).
    pub held: Vec<gpurent_sched::plan::Work>,
    /// The nodes that mount the shared volume storage (read when a queued reservation needs
    /// one).
    pub shared_volume_nodes: Vec<String>,
    /// The tenants with queued work, by id.
    pub teams: Vec<TeamUsage>,
    /// The quotas of the tenants with queued work, with what their live work holds of each
    /// type.
    pub quotas: Vec<QuotaUse>,
    /// Placed work borrowed beyond its tenant's quota on these GPUs (neither a reserved block
    /// nor stopping), as (reservation id, tenant id): guaranteed work of others may take it
    /// back. Read only when `quotas` has some.
    pub borrowed: Vec<(String, String)>,
}

/// A tenant's quota of one type and what its live work holds of that type, in milli-GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaUse {
    pub tenant_id: String,
    pub type_key: String,
    pub quota: gpurent_sched::quota::Quota,
    pub used_milli: u64,
}

/// The live nodes' capacity and load and the queue, as elastic capacity reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    pub live_nodes: u32,
    /// GPUs of the live nodes, their memory and the memory free on them (MiB).
    pub gpus: u32,
    pub vram_mb: u64,
    pub free_mb: u64,
    /// The utilisation of each GPU in the live nodes' last telemetry.
    pub gpu_utilization_pct: Vec<u32>,
    /// The CPU utilisation of each live node that reports it.
    pub cpu_utilization_pct: Vec<u32>,
    /// Reservations waiting in the queue, and when the oldest was queued.
    pub queued: u32,
    pub oldest_queued_at: Option<DateTime<Utc>>,
}

/// The result of recomputing the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerCheck {
    pub transfers: i64,
    /// Sum of all cached account balances; zero when money was neither created nor destroyed.
    pub sum: i64,
    /// Accounts whose cached balance differs from their transfers: (account, cached, derived).
    pub mismatched: Vec<(String, i64, i64)>,
    /// Holds and host earnings that do not match the reservations they belong to.
    pub problems: Vec<String>,
}

impl LedgerCheck {
    pub fn ok(&self) -> bool {
        self.sum == 0 && self.mismatched.is_empty() && self.problems.is_empty()
    }
}

/// What an `Idempotency-Key` means for a request that presents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyClaim {
    /// First use: the key is now held for this request, which should run and then be finished
    /// (or aborted when it failed).
    Fresh,
    /// The key's request ran: its answer's status and sealed body.
    Replay {
        status: u16,
        sealed_response: String,
    },
    /// The first request with the key is still running.
    InProgress,
    /// The key was used with another request body.
    Mismatch,
}

/// What an admin asks of a node: no new work (cordon), no work at all (drain: what runs there
/// moves to other nodes), or work again (uncordon).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAction {
    Cordon,
    Drain,
    Uncordon,
}

/// A node after `NodeStore::schedule_node`: its status and the reservations moved off it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    pub node_id: String,
    pub status: gpurent_types::NodeStatus,
    pub moved: Vec<String>,
}

/// What fencing the lost nodes did: the nodes now `lost`, and their reservations, each either
/// queued again with a new epoch (`rescheduled`) or ended (`ended`: `lost`, or the stop that
/// was already under way).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fenced {
    pub nodes: Vec<String>,
    pub rescheduled: Vec<String>,
    pub ended: Vec<String>,
}

/// What the control plane's `/metrics` reads from the store at scrape time: one query, so
/// one consistent snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsView {
    /// Reservations by (status, tier), every one ever made.
    pub reservations: BTreeMap<(String, String), u64>,
    /// Queued reservations by the GPU type they wait for: how many, and when the one queued
    /// first was queued.
    pub queued: BTreeMap<String, (u64, Option<DateTime<Utc>>)>,
    /// The GPUs of live nodes (seen within the node TTL and not fenced), by model.
    pub gpus: BTreeMap<String, GpuCounts>,
    /// Nodes by the status `nodes ls` shows (`ready`, `unreachable`, `unverified`,
    /// `unhealthy`, `draining`, `lost`).
    pub nodes: BTreeMap<String, u64>,
    /// Reservations preempted, ever (those still in their grace period included).
    pub preempted: u64,
    /// How the spot instances that ran have ended, as `StatementStore::spot_stats` says.
    pub spot: gpurent_types::api::SpotStats,
    /// Everything ever charged to tenants (gross), and the part of it paid to hosts.
    pub charged: Money,
    pub host_earnings: Money,
}

/// GPUs of one model: whole ones free and ones with any memory allocated, and their memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuCounts {
    pub free: u64,
    pub allocated: u64,
    pub vram_mb: u64,
    pub free_mb: u64,
}
