//! Reservations: the offers, a request for GPUs, the reservation and how to reach it
//! (its HTTP ports, proxy links, SSH), its stop.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Money, OnNodeLoss, ReservationStatus, RestartPolicy, Tier};

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
    /// Of `available`, GPUs on nodes whose instances share the node's network (they reach its
    /// loopback services and each other's ports; `gpurent nodes ls` says `network: shared`);
    /// absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_network: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ReservedDiscount {
    pub min_hours: u32,
    pub percent: u32,
    /// What one whole GPU costs per hour in a block this long.
    #[serde(default)]
    pub price_per_hour: Money,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
    /// The program and its arguments; the reservation ends when it exits. Empty: an
    /// interactive instance, running the image's own command, or without an image one that
    /// stays up for its hours, to enter by SSH or the console's terminal.
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
    /// Volumes to mount into the instance (at most 16): a volume read-write into one live
    /// reservation at a time, read-only into any number. A node-local volume places the
    /// reservation on its node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<super::MountVolume>,
    /// Start from this template (yours, else a public one): its image, command, environment
    /// and HTTP ports, each overridden by the field given here (`env` is merged); a volume
    /// given without a path goes to its volume mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Make it for this team (a member or above): paid from the team's balance, seen by its
    /// members, stopped by its members and above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// A managed job: when its run is started again (`never` by default). A restarted run
    /// goes back to the queue with the same id, the next epoch and `GPURENT_RESTART_COUNT`,
    /// and is placed on any fitting node; the time it waits is not billed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartPolicy>,
    /// How many failed (or, with `always`, finished) runs are started again before the job
    /// ends with the last one's reason: 0 to 100, 3 by default. Interruptions do not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 100)]
    pub max_restarts: Option<u32>,
    /// A volume of yours mounted read-write at `/checkpoint` in every run, named by
    /// `GPURENT_CHECKPOINT_DIR`: where a restarted run finds what the last one saved. A shared
    /// volume lets a restart go to any node; a local one keeps the job on its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_volume: Option<String>,
    /// A job array: `FIRST-LAST` (or one index) with an optional `%LIMIT`, as `0-999%50`.
    /// Each index is a task of this shape with `GPURENT_ARRAY_INDEX`, at most `LIMIT` (1,000
    /// without one) queued or running at once; the answer is the array, under one id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^[0-9]{1,7}(-[0-9]{1,7})?(%[0-9]{1,10})?$")]
    pub array: Option<String>,
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
    /// The tenant who owns it and pays for it: a user, or the team it was made for.
    pub tenant_id: String,
    /// The team it was made for, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The member who made it, where it is a team's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// Placed beyond its tenant's quota of a GPU type with quotas: the first to be preempted
    /// when a quota's owner needs its GPUs (docs/quotas.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub borrowed: bool,
    /// The endpoint it is a replica of (`gpurent endpoints`), and its number there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_replica: Option<u64>,
    /// A job array (`array`): its tasks, by where each is. The array's own id, status, charge
    /// and hold are those of its tasks together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArraySummary>,
    /// A task of a job array: the array's id and this task's index (`ID[INDEX]` names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<u64>,
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
    /// When its run is started again (`--restart`): `never` unless it is a managed job.
    #[serde(default)]
    pub restart: RestartPolicy,
    /// How many failed (or finished, with `always`) runs are started again.
    #[serde(default)]
    pub max_restarts: u32,
    /// Each time a run of it ended and it went back to the queue, oldest first: the cause,
    /// when, and that run's node and start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<Restart>,
    /// While a failed run's restart waits for its back-off (queued, no node): it is not placed
    /// before this. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
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
    /// The volumes its instance mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<super::MountedVolume>,
    /// What its instance's own disk holds of its size, as its node last measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<crate::agent::DiskUse>,
    /// How far its node's pull of its image is (while `starting`; the last figures after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<crate::agent::PullProgress>,
    /// Where its HTTP ports are reachable, while it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpEndpoint>,
    /// How to get into it over SSH: only while it runs and the control plane has an SSH
    /// endpoint (`--ssh-listen`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<ReservationSsh>,
}

/// A job array's tasks, by where each is.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ArraySummary {
    /// The indexes and the limit, as `0-999%50`.
    pub spec: String,
    /// How many tasks it has.
    pub tasks: u64,
    /// Exited 0.
    pub done: u64,
    /// Placed on a node: starting, running or stopping.
    pub running: u64,
    /// Ended any other way but a stop: exited non-zero, could not start, preempted, lost.
    pub failed: u64,
    /// Stopped, by its tenant, its credit or its hours; and, once the array is stopped, the
    /// tasks it never started.
    pub stopped: u64,
    /// Waiting: in the queue, or not started yet (the array starts them as others end).
    pub queued: u64,
    /// Why its next task cannot start now (credit, limits), while that lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A run of a reservation that ended and was started again (a managed job, or work moved off a
/// lost or drained node).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct Restart {
    /// Why the run ended: `preempted`, `node_lost`, `drained`, `exited_with_error`,
    /// `failed_to_start`, `exited` (with `always`), or the agent's own reason.
    pub cause: String,
    /// When it ended and went back to the queue.
    pub at: DateTime<Utc>,
    /// The run's epoch (the next run has the next).
    pub epoch: i64,
    /// Where it ran, and since when (absent for a run that never started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// What its instance said as it failed, at most 1000 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Whether it counted against `max_restarts` (a failure, or a finish with `always`).
    #[serde(default)]
    pub counted: bool,
}

/// A published HTTP port of a running reservation and where its owner reaches it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct HttpEndpoint {
    pub port: u16,
    /// `http(s)://HOST/proxy/ID/PORT/` on the control plane's own site: for clients with the
    /// owner's bearer token (sandboxed, no cookies).
    pub url: String,
    /// `http(s)://ID-PORT.APPS-DOMAIN/` on the apps' site: for a browser, which gets in by a
    /// one-time link (`POST /api/v1/reservations/{id}/proxy-links`, `gpurent open`).
    #[serde(default)]
    pub app_url: String,
}

/// Asks for a one-time link to a published HTTP port (`gpurent open`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProxyLink {
    pub port: u16,
}

/// A one-time link to the console (`/open/LINK`): opened in a browser logged in to the
/// console as the reservation's owner, it goes on to the app on the apps' site with a cookie
/// for that port (valid 12 hours); in anyone else's browser it says whose app it is and does
/// nothing.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProxyLink {
    pub url: String,
    /// Where the app is on the apps' site (`ID-PORT.APPS-DOMAIN`), the link's destination.
    pub app_url: String,
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

/// `GET /api/v1/reservations/{id}/gpu-usage`: what its GPUs did over its life, hour by hour,
/// from its nodes' telemetry (the hourly rollup the usage reports read).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct GpuUsage {
    /// The start of the first hour: its start's (the last 31 days of a longer life); its
    /// creation while it has not started.
    pub from: DateTime<Utc>,
    /// Its end, or now while it runs.
    pub to: DateTime<Utc>,
    /// It is a share of its GPU: the figures are the whole GPU's, its other instances' too.
    pub shared: bool,
    /// Each of its GPUs over each hour it has samples of, by hour and GPU. Whole hours: the
    /// first and the last may hold what the GPU did before its start or after its end.
    pub hours: Vec<GpuUsageHour>,
}

/// One GPU over one UTC hour: the means of the samples its agent sent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct GpuUsageHour {
    /// The start of the hour.
    pub hour: DateTime<Utc>,
    /// The GPU's UUID.
    pub gpu: String,
    pub samples: u64,
    /// Mean utilisation, percent.
    pub utilization_pct: f64,
    /// Mean memory used, MiB.
    pub memory_used_mb: f64,
    /// The most memory used in a sample, MiB.
    pub memory_max_mb: u64,
}

/// A command line as one text (the console's form, `templates create --command`): run by
/// `sh -c` when it uses the shell (pipes, `;`, quotes, variables), else split into words and
/// run directly (an image need not have a shell).
pub fn command_words(text: &str) -> Vec<String> {
    let text = text.trim();
    if text.is_empty() {
        return Vec::new();
    }
    if text.contains(|c: char| "|&;<>()$`\\\"'*?[]#~=%{}\n".contains(c)) {
        return vec!["sh".into(), "-c".into(), text.into()];
    }
    text.split_whitespace().map(str::to_owned).collect()
}
