//! Persistence for the control plane. The server speaks to a [`Store`] in intents
//! (`reserve`, `request_stop`, `sync_node`); each method runs its own transaction.
//!
//! One SQL implementation, [`SqlStore`], serves SQLite (embedded default) and PostgreSQL
//! (production) with the same statements and migrations; see `docs/ARCHITECTURE.md` for why.

mod access;
mod arrays;
mod audit_trail;
pub mod backup;
mod budgets;
mod endpoints;
mod error;
mod model;
mod notifications;
mod proxy;
mod quotas;
mod registries;
mod shared_keys;
mod sql;
mod ssh_keys;
mod teams;
mod templates;
pub mod testing;
mod tunnels;
mod usage_facts;
mod volumes;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_billing::PriceList;
use gpurent_types::agent::{Assignment, SyncRequest};
use gpurent_types::api::{
    InvoiceLine, Node, NodeEarnings, Offer, Reservation, SpotStats, StorageLine, Usage, User,
};
use gpurent_types::Money;

pub use access::{AccessStore, LoginFacts, NewToken, TenantLimits, TokenCheck, TokenFacts};
pub use arrays::{ArrayRow, ArrayStore, ArrayTasks, NewArray};
pub use audit_trail::{allocation_of, verify_audit, RecordWithin};
pub use budgets::{BudgetFacts, BudgetStore};
pub use endpoints::{
    EndpointRow, EndpointSpec, EndpointStanding, EndpointStore, NewEndpoint, ReplicaRow,
};
pub use error::StoreError;
pub use model::{
    AuthUser, Backend, Drained, Fenced, FleetView, GpuCounts, IdempotencyClaim, LedgerCheck,
    LiveGpu, MetricsView, NewNode, NewReservation, NewUser, NodeAction, NodeCertificate, QueueView,
    QueuedReservation, QuotaUse, ReplicaOf, Reserved, Scope, Synced, TeamUsage, Want,
    USAGE_HORIZON_DAYS,
};
pub use notifications::{AttemptOutcome, DueDelivery, HookRow, NotificationStore, PlatformEvent};
pub use proxy::{ProxyGrant, ProxyStore, ProxyTokenKind};
pub use quotas::{QuotaRow, QuotaStore};
pub use registries::{NewRegistry, RegistryStore};
pub use shared_keys::SharedKeyStore;
pub use sql::{CheckpointPolicy, Settled, SqlStore};
pub use ssh_keys::{NewSshKey, SshKeyStore};
pub use teams::TeamStore;
pub use templates::{NewTemplate, TemplateStore};
pub use tunnels::{TunnelHolder, TunnelStore};
pub use usage_facts::{FleetGpu, GpuHour, UsageFacts, UsedReservation};
pub use volumes::{NewVolume, NodeFilter, VolumeMountRow, VolumeNode, VolumeStore, VolumeTie};

/// The store's traits, for `use gpurent_store::prelude::*`.
pub mod prelude {
    pub use crate::{
        AccessStore, ArrayStore, AuditStore, BudgetStore, EndpointStore, MetricsStore, NodeStore,
        NotificationStore, ProxyStore, QuotaStore, RegistryStore, ReservationStore, SharedKeyStore,
        SshKeyStore, StatementStore, Store, TeamStore, TemplateStore, TunnelStore, UserStore,
        VolumeStore,
    };
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Everything the control plane keeps. Supertraits group it by subject.
pub trait Store:
    UserStore
    + AccessStore
    + NodeStore
    + ReservationStore
    + StatementStore
    + AuditStore
    + MetricsStore
    + SshKeyStore
    + TunnelStore
    + ProxyStore
    + SharedKeyStore
    + VolumeStore
    + TemplateStore
    + RegistryStore
    + TeamStore
    + BudgetStore
    + NotificationStore
    + QuotaStore
    + EndpointStore
    + ArrayStore
    + std::fmt::Debug
{
}

impl<T> Store for T where
    T: UserStore
        + AccessStore
        + NodeStore
        + ReservationStore
        + StatementStore
        + AuditStore
        + MetricsStore
        + SshKeyStore
        + TunnelStore
        + ProxyStore
        + SharedKeyStore
        + VolumeStore
        + TemplateStore
        + RegistryStore
        + TeamStore
        + BudgetStore
        + NotificationStore
        + QuotaStore
        + EndpointStore
        + ArrayStore
        + std::fmt::Debug
{
}

/// Which audit records a search returns.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub user_id: Option<String>,
    /// The resource exactly, or any resource or GPU allocation that contains it (a
    /// reservation's id finds its creation too).
    pub resource: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
}

/// The audit trail (`gpurent-audit` decides what a record and its hash are).
#[async_trait]
pub trait AuditStore: Send + Sync {
    /// Chains `entries` after the trail's head in one transaction, signing a checkpoint of the
    /// new head when `policy` says one is due; returns the new head's position.
    async fn append_audit(
        &self,
        entries: &[gpurent_audit::Entry],
        signer: &gpurent_audit::Signer,
        policy: CheckpointPolicy,
        now: DateTime<Utc>,
    ) -> Result<u64>;

    /// Up to `limit` records after position `after_seq` that match, in order.
    async fn audit_records(
        &self,
        filter: &AuditFilter,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<gpurent_audit::Record>>;

    /// The signed checkpoints of the retained trail, in order (not the anchor).
    async fn audit_checkpoints(&self) -> Result<Vec<gpurent_audit::Checkpoint>>;

    /// The checkpoint the retained trail continues from, once older records were pruned.
    async fn audit_anchor(&self) -> Result<Option<gpurent_audit::Checkpoint>>;

    /// The position and hash of the last record written (0 and the genesis hash before any).
    async fn audit_head(&self) -> Result<(u64, String)>;

    /// Removes the whole checkpointed segments whose records are all older than `before`;
    /// the last checkpoint removed up to stays as the anchor. Returns the records removed.
    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64>;
}

/// Users, API tokens and the ledger of prepaid credit.
#[async_trait]
pub trait UserStore: Send + Sync {
    fn backend(&self) -> Backend;

    /// Readiness: the store answers and can write (PostgreSQL: not a standby, not read-only;
    /// SQLite: the file is writable). Checked at most once a second.
    async fn ping(&self) -> Result<()>;

    /// Creates the `admin` user with this token hash unless an admin exists. True if created.
    async fn ensure_admin(&self, token_hash: &str, now: DateTime<Utc>) -> Result<bool>;

    /// The user of a token that is not revoked, whatever its expiry (start-up and the
    /// benchmarks); API requests use `AccessStore::check_token`, which also judges expiry.
    async fn authenticate(&self, token_hash: &str) -> Result<Option<AuthUser>>;

    /// Creates a user, its token and its balance account, and grants its initial credit.
    async fn create_user(&self, new: NewUser, now: DateTime<Utc>) -> Result<User>;

    async fn get_user(&self, id: &str) -> Result<User>;

    /// Users, oldest first: at most `limit` (capped at 1000), after the user `after`.
    async fn list_users(&self, limit: u32, after: Option<&str>) -> Result<Vec<User>>;

    /// Moves `amount` of platform credit to the user. A repeated `transfer_id` is a no-op;
    /// the same id with another amount is refused.
    async fn grant_credit(
        &self,
        user_id: &str,
        amount: Money,
        transfer_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Money>;

    async fn balance(&self, user_id: &str) -> Result<Money>;

    /// A user's three accounts: (balance, held for reservations, earned as a host).
    async fn accounts(&self, user_id: &str) -> Result<(Money, Money, Money)>;

    /// The charges to a user in [from, to), per reservation and per UTC day.
    async fn usage(&self, user_id: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<Usage>;

    /// Recomputes every balance from the transfers and checks that they sum to zero.
    async fn ledger_check(&self) -> Result<LedgerCheck>;

    /// Claims an `Idempotency-Key` (its hash, under `scope`: a route and a caller) for a request
    /// with this body hash, or says what became of its first use.
    async fn begin_idempotent(
        &self,
        scope: &str,
        key_hash: &str,
        request_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<IdempotencyClaim>;

    /// Records the answer of a request that claimed its key, for replays.
    async fn finish_idempotent(
        &self,
        scope: &str,
        key_hash: &str,
        status: u16,
        sealed_response: &str,
    ) -> Result<()>;

    /// Releases the key of a request that failed, so that a retry runs it again.
    async fn abort_idempotent(&self, scope: &str, key_hash: &str) -> Result<()>;

    /// Forgets keys claimed before `before`; returns how many.
    async fn prune_idempotency_keys(&self, before: DateTime<Utc>) -> Result<u64>;
}

/// Nodes, their GPUs and the agent protocol's desired and actual state.
#[async_trait]
pub trait NodeStore: Send + Sync {
    async fn create_join_token(
        &self,
        token_hash: &str,
        created_by: &str,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// Trades a valid join token for a node identity; returns the node id.
    async fn register_node(&self, node: NewNode, now: DateTime<Utc>) -> Result<String>;

    /// Records which health rules a node's GPUs breach now (none: healthy); a node with any is
    /// left out of placement. A change is also an event. Returns whether the node became
    /// healthy again (queued work may fit).
    async fn record_health(
        &self,
        node_id: &str,
        issues: &[gpurent_types::api::HealthIssue],
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// The id of the newest event (0 when there is none).
    async fn last_event_id(&self) -> Result<i64>;

    /// Events after `after` (an event id; 0 for all), oldest first, at most `limit`.
    async fn events(&self, after: i64, limit: u32) -> Result<Vec<gpurent_types::api::Event>>;

    /// Records a node's host verification; a node that failed it is left out of placement
    /// until a later one passes.
    async fn set_verification(
        &self,
        node_id: &str,
        verification: &gpurent_types::api::HostVerification,
    ) -> Result<()>;

    /// Records the images a node's Engine has, as its agent reported them (placement prefers a
    /// node that has a reservation's image, among equal fits).
    async fn set_node_images(&self, node_id: &str, images: &[String]) -> Result<()>;

    /// Records whether a node's executor isolates instances, as its agent reported when it
    /// started.
    async fn set_isolation(&self, node_id: &str, isolated: bool) -> Result<()>;

    /// Records whether a node's instances share its network, as its agent reported when it
    /// started.
    async fn set_shared_network(&self, node_id: &str, shared: bool) -> Result<()>;

    /// The cores and memory (MiB) the node's agent found on its host (`nodes ls`).
    async fn set_capacity(
        &self,
        node_id: &str,
        cpus: Option<u32>,
        memory_mb: Option<u64>,
    ) -> Result<()>;

    /// The node whose credential hashes to `token_hash`, and its client certificate (what
    /// every agent request checks next, read in the same statement).
    async fn authenticate_node(
        &self,
        token_hash: &str,
    ) -> Result<Option<(String, NodeCertificate)>>;

    /// Records the SHA-256 of the client certificate signed for a node at registration.
    async fn set_node_certificate(&self, node_id: &str, sha256: &str) -> Result<()>;

    /// The name of the node with this id.
    async fn node_name(&self, node_id: &str) -> Result<String>;

    /// The node's client certificate: its SHA-256 and whether it is revoked.
    async fn node_certificate(&self, node_id: &str) -> Result<NodeCertificate>;

    /// Revokes the certificate of a node (by id or name): from now on its syncs are refused,
    /// so it goes the way of a lost node. Revoking twice keeps the first time. Returns its id.
    async fn revoke_node(&self, node: &str, now: DateTime<Utc>) -> Result<String>;

    /// Records a heartbeat: new GPUs, the state of each instance the agent reports, and the
    /// latest telemetry. Returns the node's desired-state version and health as they are
    /// after it (what the answer and the health check would otherwise read again).
    async fn sync_node(
        &self,
        node_id: &str,
        report: &SyncRequest,
        now: DateTime<Utc>,
    ) -> Result<Synced>;

    async fn desired_version(&self, node_id: &str) -> Result<i64>;

    /// Every node's desired-state version, in one read: how a replica sees the changes other
    /// replicas made (`server/src/jobs/versions.rs`).
    async fn desired_versions(&self) -> Result<Vec<(String, i64)>>;

    /// What the node should run now, with the version it has.
    async fn desired_state(&self, node_id: &str) -> Result<(i64, Vec<Assignment>)>;

    /// Per live reservation on the node, how many more bytes of its output are kept from its
    /// agent's offset on before only the end of the run is (the sync's `log_room`).
    async fn log_rooms(&self, node_id: &str) -> Result<std::collections::BTreeMap<String, u64>>;

    /// Nodes (of `owner`, or all) with their status: `lost` once fenced, `ready` when seen at
    /// or after `live_since`, else `unreachable` (past the TTL, not fenced yet).
    async fn list_nodes(&self, live_since: DateTime<Utc>, owner: Option<&str>)
        -> Result<Vec<Node>>;

    /// The capacity, allocation and load of the nodes seen at or after `live_since`, and the
    /// queue: what the elastic capacity policy judges.
    async fn fleet(&self, live_since: DateTime<Utc>) -> Result<FleetView>;

    /// Cordons a node (by id or name: no new work), drains it (what runs there is billed to now
    /// and queued again with the next epoch, to run elsewhere), or uncordons it.
    async fn schedule_node(
        &self,
        node: &str,
        action: NodeAction,
        now: DateTime<Utc>,
    ) -> Result<Drained>;

    /// Forgets the hourly telemetry rollup of the hours that started before `before`; returns
    /// how many rows.
    async fn prune_gpu_hours(&self, before: DateTime<Utc>) -> Result<u64>;

    /// The hourly telemetry rollup of these GPUs (by uuid) over the hours that start in
    /// [`from`'s hour, `to`), by hour and GPU: what a reservation's GPUs did over its life. The
    /// samples of the last minute may not be written yet (`gpu_hours::FLUSH_EVERY`).
    async fn gpu_hours_of(
        &self,
        gpus: &[String],
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<GpuHour>>;

    /// Fences every node not heard from for `ttl`: it becomes `lost` (each node in one
    /// transaction) and its live reservations stop being billed at its fence time (its last
    /// heartbeat + `ttl`, never later than `now`) and give their GPU memory back; each is then
    /// queued again with its epoch bumped (`on_node_loss = reschedule`), or ended as `lost`
    /// (`stop`); one already stopping ends as its stop said.
    async fn fence_lost_nodes(
        &self,
        ttl: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<Fenced>;
}

/// Offers and reservations.
#[async_trait]
pub trait ReservationStore: Send + Sync {
    /// Free whole GPUs per type on nodes seen at or after `live_since`.
    async fn offers(&self, prices: &PriceList, live_since: DateTime<Utc>) -> Result<Vec<Offer>>;

    /// The memory of the largest GPU of this type on any node, in MiB: what a share asked in
    /// GB or as a fraction is sized against. `None` when no node has one.
    async fn gpu_vram_mb(&self, gpu_type: &gpurent_types::GpuType) -> Result<Option<u64>>;

    /// Places and records a reservation in one transaction: the candidates read are planned
    /// (`gpurent_sched::plan`) against `expected`, the requests for the type seen lately, and
    /// the plan applied with GPU memory taken by compare-and-set, so no GPU share is ever
    /// given twice (a stale plan is made again). Returns the reservation (placed, queued when
    /// nothing fits and it asked to wait, or the earlier one of its Idempotency-Key) and the
    /// nodes whose desired state changed.
    async fn reserve(
        &self,
        new: NewReservation,
        prices: &PriceList,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
        expected: &[Want],
    ) -> Result<(Reservation, Vec<String>)>;

    /// `reserve`, with the request's audit record: where a batch places the reservation at
    /// once (`sql/combiner.rs`), `record` (outcome 201, the reservation's allocation) is
    /// chained into the trail in the batch's own transaction and `Reserved::recorded` says so;
    /// otherwise nothing is recorded and the caller records the request as any other.
    async fn reserve_recorded(
        &self,
        new: NewReservation,
        prices: &PriceList,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
        expected: &[Want],
        record: RecordWithin,
    ) -> Result<Reserved>;

    async fn get_reservation(&self, id: &str, scope: &Scope) -> Result<Reservation>;

    /// The reservations in scope, newest first: at most `limit` (capped at 1000), after the
    /// reservation `after` (the last one of the previous page).
    async fn list_reservations(
        &self,
        scope: &Scope,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Vec<Reservation>>;

    /// The instance's output, its bytes from byte `offset` on (at most `max_bytes`), and the
    /// offset that follows them.
    async fn read_logs(
        &self,
        id: &str,
        scope: &Scope,
        offset: u64,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, u64)>;

    /// Writes a line of the platform's own (`[gpurent] LINE`) into the reservation's log,
    /// after what it holds, whatever the reservation's status.
    async fn append_log_note(&self, reservation_id: &str, line: &str) -> Result<()>;

    /// Removes the output of reservations that ended before `before` (a batch of them at a
    /// time); how many reservations' output went.
    async fn prune_logs(&self, before: DateTime<Utc>) -> Result<u64>;

    /// Asks for a reservation to stop; billing ends now. Stopping a stopped one is a no-op.
    async fn request_stop(
        &self,
        id: &str,
        scope: &Scope,
        now: DateTime<Utc>,
    ) -> Result<(Reservation, Option<String>)>;

    /// Marks running reservations whose time is up as stopping (billing ends at their end
    /// time, not when noticed). Returns the nodes whose desired state changed.
    async fn expire_due(&self, now: DateTime<Utc>) -> Result<Vec<String>>;

    /// Records that someone worked in the running reservation at `at` (input in an SSH
    /// session): it is not idle then, whatever its GPUs do. An older time changes nothing.
    async fn touch_reservation(&self, id: &str, at: DateTime<Utc>) -> Result<()>;

    /// Stops (end reason `idle`) every running reservation that allows it and whose GPUs have
    /// not been busy since `idle_since` (nor has it run since then); billing ends now. Returns
    /// the nodes to wake.
    async fn reclaim_idle(
        &self,
        idle_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>>;

    /// Charges every running reservation whose last settlement is `period` old or more, and
    /// stops those whose tenant cannot pay for the next period.
    async fn settle_due(&self, now: DateTime<Utc>, period: std::time::Duration) -> Result<Settled>;

    /// The queued reservations, oldest first, with the GPUs of live nodes of the types they
    /// wait for and the work holding memory there. Empty when nothing is queued.
    async fn queue_view(&self, live_since: DateTime<Utc>, now: DateTime<Utc>) -> Result<QueueView>;

    /// Applies a scheduling pass's plan for queued reservation `id` as `reserve` applies its
    /// own: preempts its victims (billing ends now, `spot_grace_s` of notice) and takes the GPU
    /// memory by compare-and-set, all in one transaction. Returns the nodes whose desired
    /// state changed, or `None` (and changes nothing) when the view was stale: the
    /// reservation is no longer queued or the memory was taken.
    async fn place_queued(
        &self,
        id: &str,
        plan: &gpurent_sched::Plan,
        prices: &PriceList,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<String>>>;

    /// Records why each of these queued reservations still waits.
    async fn note_queue_reasons(&self, reasons: &[(String, String)]) -> Result<()>;

    /// Ends as `failed` (`queue_timeout`) every reservation queued at or before
    /// `queued_before`, releasing its hold; a managed job (`--restart`) waits for capacity
    /// however long it takes. Returns their ids.
    async fn end_queue_timeouts(
        &self,
        queued_before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>>;

    /// Consistency of GPU allocations: every allocated byte owned by a live reservation and
    /// every live placed reservation holding its GPUs. Empty when consistent.
    async fn allocation_problems(&self) -> Result<Vec<String>>;
}

/// Statements read from the ledger.
#[async_trait]
pub trait StatementStore: Send + Sync {
    /// The charges to a tenant in [from, to), one line per reservation, in start order.
    async fn invoice_lines(
        &self,
        user_id: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<InvoiceLine>>;

    /// The charges to a tenant for its volumes in [from, to), one line per volume, in the
    /// order they were made.
    async fn storage_lines(
        &self,
        user_id: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<StorageLine>>;

    /// What a host's nodes earned in [from, to), per node.
    async fn earnings(
        &self,
        user_id: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<NodeEarnings>>;

    /// How the spot instances that ran have ended.
    async fn spot_stats(&self) -> Result<SpotStats>;

    /// What the usage reports of [from, to) are computed from: the reservations that held GPUs
    /// in it or were charged in it (with those charges and their hosts' shares), every GPU,
    /// and, with `telemetry`, the hourly telemetry rollup of the window.
    async fn usage_facts(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        telemetry: bool,
    ) -> Result<UsageFacts>;
}

/// The figures the control plane's `/metrics` exposes that the store already knows.
#[async_trait]
pub trait MetricsStore: Send + Sync {
    /// Reservations by status and tier, the queue, the live nodes' GPUs by model, nodes by
    /// status, preemptions, how spot instances ended and the money charged, in one query;
    /// a node seen at or after `live_since` is live.
    async fn metrics_view(&self, live_since: DateTime<Utc>) -> Result<MetricsView>;
}
