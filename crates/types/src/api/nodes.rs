//! Nodes: the fleet as `nodes ls` shows it, its GPUs, health, events and host checks, and
//! what cordon, drain, revoke and the join token answer.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
    /// Whether its instances share the node's network (`network: shared`): the process
    /// executor where no network namespace can be made for each, or unisolated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_network: bool,
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
    /// What it offers for volumes (how a local one's size is enforced, the room, the shared
    /// storage), as its agent last reported; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<crate::agent::VolumeFacts>,
}

fn isolated_by_default() -> bool {
    true
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
    /// `vram_back_under`, `vram_exceeded`, `foreign_gpu`, `unowned_gpu_process`; of no node,
    /// `login_burst` (many refused logins of one account: `detail` says whose).
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
    /// `pcie:<gpu index>`, `driver`, `cuda`, `container_toolkit`, `agent` (its release, or
    /// why its protocol is not served), `disk`.
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
