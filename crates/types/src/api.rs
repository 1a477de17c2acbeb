//! Request and response bodies of the public HTTP API (`/api/v1`), named as the CLI names them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Money, OnNodeLoss, ReservationStatus, Role, Tier};

pub use crate::access_api::{
    AddSshKey, CreateToken, Login, Session, SetPassword, SshKey, Token, TokenCreated, UpdateUser,
};

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable snake_case word: `no_capacity`, `insufficient_credit`, `not_found`, ...
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// 1 to 64 letters, digits and `_ - . @`.
    #[schema(pattern = r"^[A-Za-z0-9_.@-]{1,64}$")]
    pub name: String,
    #[serde(default)]
    pub role: Option<Role>,
    /// Prepaid credit granted on creation.
    #[serde(default)]
    pub credit: Option<Money>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UserCreated {
    pub id: String,
    pub name: String,
    pub role: Role,
    /// The user's API token. Shown once; only its hash is stored.
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct User {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub balance: Money,
    pub created_at: DateTime<Utc>,
    /// Its override of the platform's cap on live reservations (none: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reservations: Option<u32>,
    /// Its override of the platform's cap on spend per hour (none: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_spend_per_hour: Option<Money>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantCredit {
    pub amount: Money,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreditGranted {
    pub user_id: String,
    pub balance: Money,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Balance {
    /// What the user may spend.
    pub balance: Money,
    pub currency: String,
    /// Set aside for the user's reservations: a first hour not yet settled, or the unused
    /// part of a prepaid reserved block.
    #[serde(default)]
    pub held: Money,
    /// Earned as the owner of nodes.
    #[serde(default)]
    pub earnings: Money,
}

/// What can be rented now, per GPU type.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct Offer {
    pub gpu_type: String,
    pub vram_gb: u32,
    /// The card's memory in MiB (the largest of the type), what shares are fractions of.
    #[serde(default)]
    pub vram_mb: u64,
    /// Whole GPUs free now.
    pub available: u32,
    /// Price of one whole GPU for one hour (on-demand).
    pub price_per_hour: Money,
    /// The lowest spot bid for one whole GPU for one hour.
    pub spot_min_bid: Money,
    /// The stepped tier for one whole GPU: this per hour for the first `stepped_first_hours`,
    /// then `stepped_then_per_hour`.
    pub stepped_price_per_hour: Money,
    pub stepped_first_hours: u32,
    pub stepped_then_per_hour: Money,
    /// Shares of a GPU (`vram_gb`, `vram_fraction`): per GB of memory per hour (a share
    /// costs its fraction of the whole GPU's on-demand price).
    pub share_price_per_gb_hour: Money,
    /// Reserved blocks: percent off the on-demand price by the block's length.
    pub reserved_discounts: Vec<ReservedDiscount>,
    /// The currency of every price (ISO 4217, the platform's).
    #[serde(default)]
    pub currency: String,
    /// Of `available`, GPUs on nodes that run instances unisolated (their tenants can read the
    /// node's credentials and each other's work; `gpurent nodes ls` says which); absent when
    /// none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unisolated: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ReservedDiscount {
    pub min_hours: u32,
    pub percent: u32,
    /// What one whole GPU costs per hour in a block this long.
    #[serde(default)]
    pub price_per_hour: Money,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateReservation {
    /// A GPU model (`RTX 4090`, `rtx4090`, `A100-80GB`, a MIG instance `H200 MIG 3g.71gb`):
    /// letters, digits, spaces, `-`, `_` and `.`.
    #[schema(pattern = r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$")]
    pub gpu_type: String,
    /// Whole GPUs on one node. Default 1 unless `vram_gb` asks for a share.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 64)]
    pub gpu_count: Option<u32>,
    /// A share of one GPU: this many GB of its memory. Up to the card's memory to the nearest
    /// GB (24 on a 24,564 MiB RTX 4090 is all of it, still a share).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1024)]
    pub vram_gb: Option<u32>,
    /// A share of one GPU as a fraction of its memory (0.5: half the card), more than 0 and at
    /// most 1; instead of `gpu_count` and `vram_gb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub vram_fraction: Option<f64>,
    /// How long the reservation runs before it expires, counted from when it starts running.
    #[schema(minimum = 0.001, maximum = 8760.0)]
    pub hours: f64,
    #[serde(default)]
    pub tier: Option<Tier>,
    /// Highest price per hour a spot reservation pays.
    #[serde(default)]
    pub bid: Option<Money>,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Ports of the instance to publish on the node (Docker executor), e.g. `[8888]`.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Ports of the instance to reach over HTTP through the control plane (at most 8), at
    /// `/proxy/ID/PORT/` for the owner only, WebSockets included, e.g. `[8888]` for Jupyter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_ports: Vec<u16>,
    /// When nothing fits now (and preempting spot work cannot make room), wait in the queue
    /// as `pending` instead of answering 409 `no_capacity`. The first hour is held as usual.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queue: bool,
    /// When its node is lost: `reschedule` (default) runs it again on another node from its
    /// image, with a new epoch and the rest of its hours; `stop` ends it as `lost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_node_loss: Option<OnNodeLoss>,
    /// Whether it is stopped after its GPUs have been idle (zero utilisation) for the
    /// platform's idle time (`--idle-reclaim-minutes`, 5 by default). Default true; false keeps
    /// it running however idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_reclaim: Option<bool>,
    /// Give the instance a checkpoint volume (`GPURENT_CHECKPOINT_DIR`, `/checkpoint` in a
    /// container) that outlives it: a run rescheduled after a node loss finds what the last
    /// one saved there, where the nodes share the owner's checkpoint storage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint: bool,
    /// Secret environment variables: kept encrypted, given only to the instance, never shown
    /// again (a reservation lists their names).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Reservation {
    pub id: String,
    pub status: ReservationStatus,
    pub gpu_type: String,
    pub gpu_count: u32,
    /// Set when the reservation is a share of one GPU.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub vram_gb: Option<u32>,
    pub tier: Tier,
    /// What the whole reservation costs per hour of running.
    pub price_per_hour: Money,
    pub hours: f64,
    /// Name of the node it was placed on.
    pub node: Option<String>,
    /// UUIDs of its GPUs.
    pub gpus: Vec<String>,
    /// Where its published ports are reachable on its node, once it runs.
    #[serde(default)]
    pub ports: Vec<crate::agent::PublishedPort>,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// Why it ended: `stopped_by_user`, `expired`, `exited`, ...
    pub end_reason: Option<String>,
    /// Why its instance failed, in the executor's words (`failed_to_start`: a missing image,
    /// a refused limit; `exited_with_error`: the exit code), at most 1000 characters; absent
    /// for every other end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_message: Option<String>,
    /// What it has been charged so far.
    pub charged: Money,
    /// What the tenant's hold keeps for it: its first hour until the first settlement, or
    /// the unused part of a prepaid reserved block.
    #[serde(default)]
    pub held: Money,
    /// A spot reservation's bid per hour (what it pays).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub bid: Option<Money>,
    /// The tenant who owns it.
    pub tenant_id: String,
    /// Why a queued reservation still waits (`pending` without a node); null otherwise.
    #[serde(default)]
    pub queue_reason: Option<String>,
    /// Seconds from its creation to its placement on GPUs; null until placed.
    #[serde(default)]
    pub waited_s: Option<f64>,
    /// What happens to it when its node is lost: `reschedule` or `stop`.
    #[serde(default)]
    pub on_node_loss: OnNodeLoss,
    /// Its fencing epoch: 1, plus one each time it was rescheduled off a lost node.
    #[serde(default)]
    pub epoch: i64,
    /// Whether it is stopped (end reason `idle`) once its GPUs have been idle for the
    /// platform's idle time.
    #[serde(default)]
    pub idle_reclaim: bool,
    /// Whether its instance gets a checkpoint volume that outlives it.
    #[serde(default)]
    pub checkpoint: bool,
    /// The names of its secret environment variables (their values are never shown).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Ports of its instance published over HTTP through the control plane's proxy.
    #[serde(default)]
    pub http_ports: Vec<u16>,
    /// Where its HTTP ports are reachable, while it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpEndpoint>,
    /// How to get into it over SSH: only while it runs and the control plane has an SSH
    /// endpoint (`--ssh-listen`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<ReservationSsh>,
}

/// A published HTTP port of a running reservation and where its owner reaches it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct HttpEndpoint {
    pub port: u16,
    /// `http(s)://HOST/proxy/ID/PORT/`: the bearer token or a cookie from a one-time link
    /// (`POST /api/v1/reservations/{id}/proxy-links`) gets in.
    pub url: String,
}

/// Asks for a one-time link to a published HTTP port (`gpurent open`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProxyLink {
    pub port: u16,
}

/// A one-time link: opening it in a browser sets a cookie for that port of that reservation
/// (valid 12 hours) and goes on to the app.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProxyLink {
    pub url: String,
    /// The same link on the proxy domain (`ID-PORT.DOMAIN`), where the server has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_url: Option<String>,
    /// The link works once, until then.
    pub expires_at: DateTime<Utc>,
}

/// The SSH connection details of a running reservation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ReservationSsh {
    /// The SSH user: the reservation's id.
    pub user: String,
    pub host: String,
    pub port: u16,
    /// `ssh -p PORT USER@HOST`, for a terminal.
    pub command: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReservationStopped {
    pub id: String,
    pub status: ReservationStatus,
}

/// A node whose certificate an admin revoked (`gpurent nodes revoke`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeRevoked {
    pub node_id: String,
    /// Always true: its syncs are refused from now on.
    pub revoked: bool,
}

/// A node after a cordon, drain or uncordon (an admin, or the host that owns it).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeScheduled {
    pub node_id: String,
    /// `draining` after a cordon or drain (no new work), `ready` after an uncordon; `lost`
    /// stays `lost` until its agent syncs again.
    pub status: String,
    /// The reservations a drain moved off the node (each runs again elsewhere, with the next
    /// epoch, billed from when it runs there).
    pub moved: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JoinToken {
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Node {
    pub id: String,
    pub name: String,
    /// The user whose join token registered it: its earnings go to them.
    pub owner_id: Option<String>,
    /// `ready` while heartbeats arrive; `lost` once none came for the node TTL (its work was
    /// billed up to then and rescheduled or ended), `ready` again when its agent is back;
    /// `unreachable` past the TTL until the control plane fences it (a second at most);
    /// `unhealthy` and `draining` are reserved for health rules and drains.
    pub status: String,
    pub executor: String,
    /// Whether its executor keeps each instance from the node's secrets and from the other
    /// instances; false: the process executor with `--allow-unisolated` (or an older agent's).
    #[serde(default = "isolated_by_default")]
    pub isolated: bool,
    pub gpu_backend: String,
    /// Logical cores its agent reported; absent until an agent that reports them syncs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// The host's memory its agent reported, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub last_seen_at: DateTime<Utc>,
    pub gpus: Vec<Gpu>,
    /// Host verification (the last the agent reported); a node that fails it gets no work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<HostVerification>,
    /// The health rules its GPUs breach now; a node with any is `unhealthy` and gets no work.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health: Vec<HealthIssue>,
}

fn isolated_by_default() -> bool {
    true
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A GPU health rule breached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthIssue {
    pub gpu_uuid: String,
    /// `temperature`, `vram`, `ecc`, `xid` or `lost`.
    pub rule: String,
    pub detail: String,
}

/// Something that happened to a node (`gpurent events`), in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Increasing: ask for the events after the last one seen.
    pub id: i64,
    pub at: DateTime<Utc>,
    pub node_id: Option<String>,
    /// `node_unhealthy`, `node_healthy`; from the agent's VRAM watchdog `vram_over_share`,
    /// `vram_back_under`, `vram_exceeded`, `foreign_gpu`, `unowned_gpu_process`.
    pub kind: String,
    pub detail: String,
    /// The reservation it concerns, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
}

/// The host checks of a node, each passed or failed with what was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HostVerification {
    pub ok: bool,
    pub checks: Vec<HostCheck>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HostCheck {
    /// `pcie:<gpu index>`, `driver`, `cuda`, `container_toolkit`, `disk`.
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Gpu {
    pub uuid: String,
    pub model: String,
    pub vram_gb: u32,
    /// `free`, `allocated` (wholly) or `shared` (partly allocated).
    pub status: String,
    /// GPUs of the node with the same number share a PCIe switch; absent where unknown.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub switch_group: Option<u32>,
    /// The latest sample from the node's agent.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub telemetry: Option<crate::agent::GpuSample>,
}

/// The ledger recomputed from its transfers (`gpurent admin ledger-check`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LedgerReport {
    /// Every account's cached balance equals its transfers, and all balances sum to zero.
    pub ok: bool,
    pub transfers: i64,
    /// Sum of all balances: zero when money was neither created nor destroyed.
    pub sum: Money,
    pub mismatched: Vec<LedgerMismatch>,
    /// Holds and host earnings that disagree with the reservations they belong to.
    #[serde(default)]
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LedgerMismatch {
    pub account: String,
    pub cached: Money,
    pub derived: Money,
}

/// What a tenant was charged in a time window, per reservation and per day (UTC).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct Usage {
    pub user_id: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub total: Money,
    pub reservations: Vec<ReservationUsage>,
    pub days: Vec<DayUsage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ReservationUsage {
    pub reservation_id: String,
    pub charged: Money,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct DayUsage {
    /// YYYY-MM-DD, UTC.
    pub date: String,
    pub charged: Money,
}

/// A monthly invoice: what a tenant was charged in one calendar month (UTC), per reservation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Invoice {
    /// `GR-YYYYMM-<first 8 characters of the user id>`.
    pub number: String,
    pub user_id: String,
    pub user_name: String,
    /// `YYYY-MM`.
    pub month: String,
    pub period_start: DateTime<Utc>,
    pub period_end: DateTime<Utc>,
    pub currency: String,
    pub lines: Vec<InvoiceLine>,
    pub total: Money,
}

/// One reservation's charges within an invoice's month.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct InvoiceLine {
    pub reservation_id: String,
    pub gpu_type: String,
    pub gpu_count: u32,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub vram_gb: Option<u32>,
    pub tier: Tier,
    pub price_per_hour: Money,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub amount: Money,
}

/// What a host earned from its nodes in a time window.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct Earnings {
    pub user_id: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub total: Money,
    pub nodes: Vec<NodeEarnings>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct NodeEarnings {
    pub node_id: String,
    pub node: String,
    pub earned: Money,
}

/// How spot instances ended: those that ran to their end or their tenant's stop, against those
/// the platform interrupted (preempted, or stopped by their node).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct SpotStats {
    pub ended: u64,
    pub completed: u64,
    pub preempted: u64,
    pub interrupted: u64,
    /// completed / ended; absent before any spot instance ended.
    pub success_rate: Option<f64>,
}

/// One API request as the audit trail keeps it, chained to the record before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditRecord {
    /// Its position in the trail: 1, 2, 3, ...
    pub seq: u64,
    pub request_id: String,
    pub at: DateTime<Utc>,
    /// Who made it (`node:<id>` for an agent); null when no one was authenticated.
    pub user_id: Option<String>,
    /// `METHOD /route/{template}`.
    pub action: String,
    /// The path it acted on.
    pub resource: String,
    /// The reservation and GPUs involved, where one was.
    pub allocation: Option<String>,
    /// The HTTP status answered.
    pub outcome: u16,
    /// The client's address.
    pub client: String,
    /// SHA-256 (hex) of the record before it, and of this one.
    pub prev_hash: String,
    pub hash: String,
}

/// A page of audit records; ask again with `after = next_after` for more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    pub records: Vec<AuditRecord>,
    /// Null when this page is the last.
    pub next_after: Option<u64>,
}

/// A signed checkpoint of the trail's head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditCheckpoint {
    pub seq: u64,
    pub hash: String,
    pub at: DateTime<Utc>,
    /// Ed25519 signature (hex) by `public_key`.
    pub signature: String,
    pub public_key: String,
    /// The checkpoint the retained trail continues from after older records were pruned.
    pub anchor: bool,
}

/// What verification of the whole retained trail found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditVerdict {
    pub ok: bool,
    /// Records read.
    pub records: u64,
    /// Signed checkpoints the chain matched.
    pub checkpoints: u64,
    /// The first record altered, removed or out of place; null when `ok`.
    pub first_bad: Option<AuditProblem>,
    /// The server's key (hex) the checkpoints were verified with.
    pub public_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditProblem {
    /// The position of the record concerned.
    pub seq: u64,
    /// `altered`, `missing`, `out_of_order`, `rewritten` or `bad_signature`.
    pub problem: String,
    pub message: String,
}
