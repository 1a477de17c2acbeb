//! The agent protocol: agents pull desired state and push actual state (`/api/v1/agent/*`).
//!
//! One round trip, `POST /api/v1/agent/sync`, carries the agent's report and answers with its
//! desired state; the server may hold the answer until the desired state changes (long poll).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod images;

pub use images::*;

/// The agent protocol this release speaks, sent by the agent with every call in the
/// [`AGENT_PROTOCOL_HEADER`] header. It goes up by one in a release whose agent protocol
/// changed; the control plane serves agents of its own protocol and of the one before
/// ([`OLDEST_AGENT_PROTOCOL`]), so agents are upgraded after the control plane, one release
/// at a time. Agents that send no header speak protocol 1 (the releases before the header).
pub const AGENT_PROTOCOL: u32 = 2;

/// The oldest agent protocol the control plane serves: one release back.
pub const OLDEST_AGENT_PROTOCOL: u32 = AGENT_PROTOCOL - 1;

/// The header that carries an agent's protocol (a decimal number).
pub const AGENT_PROTOCOL_HEADER: &str = "gpurent-agent-protocol";

/// The header that carries an agent's release (`gpurent --version`'s number), for messages.
pub const AGENT_VERSION_HEADER: &str = "gpurent-agent-version";

/// Why a control plane of this release cannot serve an agent that speaks `protocol` (of
/// release `version`, when it said), and what to do; `None` when it can.
pub fn agent_protocol_refusal(protocol: u32, version: Option<&str>) -> Option<String> {
    let agent = match version {
        Some(version) => format!("this agent (gpurent {version}) speaks agent protocol {protocol}"),
        None => format!("this agent speaks agent protocol {protocol}"),
    };
    let served = format!(
        "this control plane (gpurent {}) serves protocols {OLDEST_AGENT_PROTOCOL} to {AGENT_PROTOCOL}",
        env!("CARGO_PKG_VERSION")
    );
    if protocol > AGENT_PROTOCOL {
        Some(format!(
            "{agent}, newer than {served}: upgrade the control plane's replicas first, then the agents"
        ))
    } else if protocol < OLDEST_AGENT_PROTOCOL {
        Some(format!(
            "{agent}, older than {served}: upgrade the agent (one release at a time)"
        ))
    } else {
        None
    }
}

/// A GPU as the agent found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// Model as the driver names it, e.g. `NVIDIA H200`.
    pub model: String,
    pub vram_mb: u64,
    /// PCIe link generation and width now (x16 against x8 matters for training time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_gen: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_width: Option<u32>,
    /// The fastest and widest link the GPU and its slot allow (a link narrower than this fails
    /// host verification; a slower generation is a GPU at rest saving power).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_gen_max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_width_max: Option<u32>,
    /// Whether MIG mode is enabled now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_enabled: Option<bool>,
    /// GPUs of a node with the same number share a PCIe switch (or are closer still, on one
    /// board); `None` where the topology is not known. Multi-GPU work goes under one switch
    /// when it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_group: Option<u32>,
}

impl GpuInfo {
    /// A GPU known only by index, UUID, model and memory (simulated ones).
    pub fn basic(index: u32, uuid: String, model: String, vram_mb: u64) -> Self {
        GpuInfo {
            index,
            uuid,
            model,
            vram_mb,
            pcie_gen: None,
            pcie_width: None,
            pcie_gen_max: None,
            pcie_width_max: None,
            mig_enabled: None,
            switch_group: None,
        }
    }
}

/// One sample of a node's GPUs (and its CPU), sent with every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, Default)]
pub struct NodeTelemetry {
    /// A burn-in of the node's GPUs running now, or the last one failed (`None`: neither).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burn_in: Option<BurnInState>,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub gpus: Vec<GpuSample>,
    /// The node's CPU utilisation (all CPUs) since the previous sample, in percent; absent
    /// from older agents and from an agent's first heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_utilization_pct: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuSample {
    pub uuid: String,
    pub utilization_pct: u32,
    pub memory_used_mb: u64,
    pub temperature_c: u32,
    pub power_mw: u64,
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected: u64,
    /// The GPU's memory, MiB (0 where not reported), for the VRAM health rule.
    #[serde(default)]
    pub memory_total_mb: u64,
    /// XID errors the driver raised since the last sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid_errors: Vec<u64>,
    /// The GPU no longer answers (fallen off the bus); the other figures are zero.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
    /// Compute processes on this GPU and the memory each holds.
    pub processes: Vec<GpuProcess>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_mb: u64,
    /// The reservation whose instance the process belongs to, when the agent knows it.
    pub reservation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterNode {
    pub join_token: String,
    /// 1 to 64 letters, digits and `- _ .`.
    #[schema(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    pub name: String,
    pub executor: String,
    pub gpu_backend: String,
    pub gpus: Vec<GpuInfo>,
    /// The host as the agent found it, verified by the control plane before any work lands.
    #[serde(default)]
    pub host: Option<HostFacts>,
    /// A PEM certificate signing request for the node's own key. Over TLS the control plane
    /// requires it and signs the node's client certificate from it (mutual TLS from then on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csr: Option<String>,
}

/// The periodic burn-in of a node's idle GPUs, as its agent reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BurnInState {
    pub running: bool,
    /// Why the last run failed; `None` when it passed (or none ran yet).
    #[serde(default)]
    pub failed: Option<String>,
}

/// What an agent finds of its host when it starts (host verification, `gpurent nodes ls`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HostFacts {
    #[serde(default)]
    pub driver_version: Option<String>,
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// The NVIDIA container toolkit's version (`nvidia-ctk --version`), when installed.
    #[serde(default)]
    pub container_toolkit: Option<String>,
    /// Whether this node runs GPUs in containers (Docker with real GPUs), which needs the
    /// toolkit.
    #[serde(default)]
    pub gpu_containers: bool,
    /// Free space in the agent's data directory, MiB.
    #[serde(default)]
    pub disk_free_mb: Option<u64>,
    /// Whether the node's executor keeps each instance from the node's secrets and from the
    /// other instances (false: the process executor with `--allow-unisolated`); absent from
    /// older agents, whose process executor did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated: Option<bool>,
    /// Whether its instances share the node's network (true: the process executor where no
    /// network namespace can be made for each, or unisolated); absent from older agents,
    /// whose process executor shared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_network: Option<bool>,
    /// Logical cores available to the agent (its affinity and cgroup quota counted); absent
    /// from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// The host's memory (`MemTotal`), MiB; absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// The agent's release (`gpurent --version`'s number); absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// What the node offers for volumes; absent from older agents (none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<VolumeFacts>,
}

/// What a node offers for tenants' volumes (`--volumes-dir`, `--shared-volumes-dir`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeFacts {
    /// How a node-local volume's size is enforced: `project-quota`, `loop`, or
    /// `unavailable` (then `reason` says why, and the node takes no local volumes).
    pub enforcement: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes free for new local volumes on the volumes dir's file system.
    pub free_bytes: u64,
    /// Whether it mounts the owner's shared volume storage.
    #[serde(default)]
    pub shared: bool,
}

/// A volume an instance mounts, as its agent is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Mount {
    pub volume_id: String,
    pub kind: crate::api::VolumeKind,
    /// A local volume's size: made at it if its node has not made it yet.
    pub size_bytes: u64,
    /// Where the instance sees it (absolute, checked by the control plane).
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    /// A managed job's checkpoint volume: `GPURENT_CHECKPOINT_DIR` names where it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint: bool,
}

/// A node-local volume the control plane wants on a node: made (or grown) to `size_bytes`,
/// or removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeVolume {
    pub volume_id: String,
    pub kind: crate::api::VolumeKind,
    pub size_bytes: u64,
    /// Its node made it once: if its data is missing now, that is an error to report, not a
    /// volume to make again empty.
    #[serde(default)]
    pub made: bool,
    #[serde(default)]
    pub remove: bool,
}

/// What an agent has of a node-local volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeReport {
    pub volume_id: String,
    /// Its size as made (after a grow, the new one); none when it is gone or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Removed from the node, as asked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
    /// Why it could not be made, grown or removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeRegistered {
    pub node_id: String,
    /// The node's credential for every later call. Shown once; only its hash is stored.
    pub node_token: String,
    /// The node's client certificate (PEM), signed from its CSR by the control plane's CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// The CA that signed it (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificate: Option<String>,
}

/// What the control plane wants a node to run. The epoch fences it: the agent acts only on the
/// highest epoch it has seen for a reservation, and the server ignores reports of older epochs.
/// Secret environment variables of an instance: sent to its agent as a map, never shown by
/// `Debug` (logs) but by name.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secrets(pub BTreeMap<String, String>);

impl Secrets {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Assignment {
    pub reservation_id: String,
    pub epoch: i64,
    /// How many times its run was started again (a managed job's restarts, work moved off a
    /// lost or drained node): `GPURENT_RESTART_COUNT`.
    #[serde(default)]
    pub restart_count: u64,
    /// A job array's task: its index, `GPURENT_ARRAY_INDEX`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<u64>,
    pub gpus: Vec<String>,
    /// Set for a share of a GPU: the memory the instance may use.
    pub vram_mb: Option<u64>,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub run: bool,
    /// Ports of the instance to publish on the node.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Bytes of the instance's output the control plane has; the agent sends what follows.
    #[serde(default)]
    pub log_offset: u64,
    /// Seconds between SIGTERM and SIGKILL when this instance is stopped (a preempted spot
    /// instance gets its notice this way); `None`: the agent's default.
    #[serde(default)]
    pub stop_grace_s: Option<u64>,
    /// Mount the reservation's checkpoint volume (kept across epochs and restarts).
    #[serde(default)]
    pub checkpoint: bool,
    /// The tenant's volumes it mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Secret environment variables, opened by the control plane for this answer only.
    #[serde(default, skip_serializing_if = "Secrets::is_empty")]
    #[schema(value_type = BTreeMap<String, String>)]
    pub secrets: Secrets,
    /// The secrets as the store keeps them, sealed; never sent.
    #[serde(skip)]
    #[schema(ignore)]
    pub sealed_secrets: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Starting,
    Running,
    /// The workload ended by itself with this exit code.
    Exited,
    /// Stopped because the control plane asked.
    Stopped,
    /// Could not be started.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InstanceReport {
    pub reservation_id: String,
    pub epoch: i64,
    pub state: InstanceState,
    pub exit_code: Option<i32>,
    pub message: Option<String>,
    /// Where the instance's ports are reachable on the node, once running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PublishedPort>,
    /// Why the agent itself ended the instance (`vram_exceeded`): the end reason, unless the
    /// control plane had asked for a stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// What its own disk holds and its size, measured now and then (a minute apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskUse>,
    /// While it is `starting` because its node pulls its image: how far the pull is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullProgress>,
}

/// An instance's own disk: bytes used of its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DiskUse {
    pub used_bytes: u64,
    pub size_bytes: u64,
}

/// An instance's port and the node's port that reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PublishedPort {
    pub container_port: u16,
    pub host_port: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    /// The node's whole inventory, on the first sync after the agent starts (with `host`);
    /// empty on the others. A GPU it no longer lists leaves placement.
    pub gpus: Vec<GpuInfo>,
    pub instances: Vec<InstanceReport>,
    /// The desired-state version the agent already has; the server waits for a newer one.
    #[serde(default)]
    pub known_version: Option<i64>,
    /// How long the server may hold the answer, in milliseconds (at most 30 000).
    #[serde(default)]
    pub wait_ms: Option<u64>,
    #[serde(default)]
    pub telemetry: Option<NodeTelemetry>,
    /// New output of instances, each chunk starting where the control plane's copy ends.
    #[serde(default)]
    pub logs: Vec<LogChunk>,
    /// The host's facts, with the inventory (on the first sync after the agent starts).
    #[serde(default)]
    pub host: Option<HostFacts>,
    /// What the agent's VRAM watchdog found since the last answered sync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<AgentEvent>,
    /// Its node-local volumes: each the control plane asked for, when something changed,
    /// and every few minutes with what they use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeReport>,
    /// Bytes free on the file system of its local volumes, measured with their use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_free_bytes: Option<u64>,
    /// The images its Engine has (`name:tag`, at most `NODE_IMAGES_MAX`), when they changed:
    /// placement prefers a node that has a reservation's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
}

/// Something the agent saw on its GPUs, for `gpurent events` and, when it names a
/// reservation, a line in that reservation's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentEvent {
    pub kind: AgentEventKind,
    /// The reservation whose instance it concerns; none for a process of no instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    pub gpu_uuid: String,
    /// What was seen, in words (at most [`AGENT_EVENT_DETAIL_MAX`] bytes).
    pub detail: String,
}

/// The longest detail of an [`AgentEvent`], in bytes.
pub const AGENT_EVENT_DETAIL_MAX: usize = 1000;

/// The end reasons an agent may give an instance it ended itself
/// ([`InstanceReport::end_reason`]); the control plane ignores any other.
pub const AGENT_END_REASONS: &[&str] = &["vram_exceeded"];

/// The kinds of [`AgentEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentEventKind {
    /// A share's processes use more GPU memory than the share (its grace begins).
    VramOverShare,
    /// Back within the share before the grace was over.
    VramBackUnder,
    /// Still over the share (or on a foreign GPU) once the grace was over: stopped.
    VramExceeded,
    /// A process of an instance on a GPU that is not the instance's.
    ForeignGpu,
    /// A process of no instance on a GPU an instance holds (the host's own work).
    UnownedGpuProcess,
}

impl AgentEventKind {
    pub const ALL: [AgentEventKind; 5] = [
        AgentEventKind::VramOverShare,
        AgentEventKind::VramBackUnder,
        AgentEventKind::VramExceeded,
        AgentEventKind::ForeignGpu,
        AgentEventKind::UnownedGpuProcess,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentEventKind::VramOverShare => "vram_over_share",
            AgentEventKind::VramBackUnder => "vram_back_under",
            AgentEventKind::VramExceeded => "vram_exceeded",
            AgentEventKind::ForeignGpu => "foreign_gpu",
            AgentEventKind::UnownedGpuProcess => "unowned_gpu_process",
        }
    }
}

/// What the control plane keeps of a reservation's output: its first bytes up to the cap, and
/// past it a marker line and the last [`LOG_TAIL_BYTES`] of each epoch's output.
pub const LOG_CAP_BYTES: u64 = 16 * 1024 * 1024;
/// The end of an epoch's output kept past the cap.
pub const LOG_TAIL_BYTES: u64 = 64 * 1024;

/// A piece of an instance's output (stdout and stderr, as they were interleaved), as its bytes
/// (`data_base64`). Older agents sent `data`, text with invalid UTF-8 replaced; the control
/// plane still takes that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LogChunk {
    pub reservation_id: String,
    /// The epoch whose run wrote it; a chunk of another epoch's run is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// Where in the epoch's output this chunk starts, in bytes.
    pub offset: u64,
    /// How many bytes it holds: a chunk whose data has another size is refused.
    pub length: u64,
    /// The bytes, as text (older agents; invalid UTF-8 replaced).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// The bytes, base64 (standard alphabet, padded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
}

/// A chunk whose bytes cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the chunk's data_base64 is not base64: {0}")]
pub struct LogChunkError(String);

impl LogChunk {
    /// A chunk of these bytes of the epoch's output, from `offset`.
    pub fn of_bytes(reservation_id: &str, epoch: i64, offset: u64, bytes: &[u8]) -> Self {
        use base64::Engine as _;
        LogChunk {
            reservation_id: reservation_id.to_owned(),
            epoch: Some(epoch),
            offset,
            length: bytes.len() as u64,
            data: String::new(),
            data_base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }

    /// Its bytes: `data_base64` decoded, else the bytes of `data`.
    pub fn bytes(&self) -> Result<Vec<u8>, LogChunkError> {
        use base64::Engine as _;
        match &self.data_base64 {
            Some(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| LogChunkError(e.to_string())),
            None => Ok(self.data.as_bytes().to_vec()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SyncResponse {
    pub node_id: String,
    pub version: i64,
    pub server_time: DateTime<Utc>,
    pub assignments: Vec<Assignment>,
    /// Per reservation, how many more bytes of its output the control plane keeps from its
    /// `log_offset` on; past them it keeps only the end of the epoch's output (its last 64 KiB),
    /// which the agent ships once the instance ended. Not named: no limit known (an older
    /// control plane).
    #[serde(default)]
    pub log_room: BTreeMap<String, u64>,
    /// The node-local volumes it should have (absent: an older control plane, which has
    /// none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<NodeVolume>,
}

#[cfg(test)]
mod protocol_tests {
    use super::*;

    #[test]
    fn the_control_plane_serves_its_own_protocol_and_the_one_before() {
        assert_eq!(agent_protocol_refusal(AGENT_PROTOCOL, Some("0.1.0")), None);
        assert_eq!(agent_protocol_refusal(OLDEST_AGENT_PROTOCOL, None), None);
        let newer = agent_protocol_refusal(AGENT_PROTOCOL + 1, Some("9.0.0")).unwrap();
        assert!(newer.contains("gpurent 9.0.0"), "{newer}");
        assert!(newer.contains("upgrade the control plane"), "{newer}");
        let older = agent_protocol_refusal(OLDEST_AGENT_PROTOCOL - 1, None).unwrap();
        assert!(older.contains("upgrade the agent"), "{older}");
    }
}
