//! What the usage reports are computed from: the reservations that held GPUs in a window, the
//! fleet's GPUs, and the hourly telemetry rollup (`gpu_hours`).

use chrono::{DateTime, Utc};
use gpurent_types::{Money, ReservationStatus, Tier};

/// A reservation as the reports see it: who, where, when it held its GPUs, and the money that
/// moved for it within the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsedReservation {
    pub id: String,
    pub tenant_id: String,
    pub tenant: String,
    /// Its tenant is a team.
    pub team: bool,
    /// The member who made it (by name), where it is a team's.
    pub made_by: Option<String>,
    /// Its node (the last one, for a reservation that was moved after a node loss).
    pub node_id: Option<String>,
    pub node: Option<String>,
    pub gpus: Vec<String>,
    /// The GPU memory of a share (`--vram-gb`); `None` for whole GPUs.
    pub share_mb: Option<i64>,
    pub tier: Tier,
    pub status: ReservationStatus,
    pub end_reason: Option<String>,
    /// When it started (its effective start, for one moved after a node loss); `None` while
    /// it waits in the queue again.
    pub started_at: Option<DateTime<Utc>>,
    /// When its billing ended (the stop, preemption or fence time, else when it ended);
    /// `None` while it runs.
    pub ended_at: Option<DateTime<Utc>>,
    /// Its `charge` transfers within the window.
    pub charged: Money,
    /// The part of its charges that goes to its node's owner, in basis points.
    pub host_share_bps: u32,
}

/// A GPU of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetGpu {
    pub uuid: String,
    pub node_id: String,
    pub node: String,
    pub index: u32,
    pub model: String,
    pub vram_mb: i64,
}

/// One GPU's telemetry over one UTC hour: sums over the samples its agent sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHour {
    pub gpu_uuid: String,
    pub hour: DateTime<Utc>,
    pub samples: i64,
    pub util_sum: i64,
    pub mem_used_mb_sum: i64,
    pub mem_max_mb: i64,
}

/// Everything a report of [from, to) needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageFacts {
    pub reservations: Vec<UsedReservation>,
    pub gpus: Vec<FleetGpu>,
    pub hours: Vec<GpuHour>,
    /// What each node's owner earned in the window (its `earning` transfers), by node id.
    pub node_earnings: Vec<(String, Money)>,
}
