//! The bodies of the usage reports (`/api/v1/reports/...`): a day per tenant, node and GPU
//! with hourly VRAM, and a week per price tier.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Money, ReservationStatus, Tier};

/// One UTC day of the fleet's use. GPU-hours count a share as its part of the GPU's memory;
/// VRAM-hours are GB-hours of allocated GPU memory (a whole GPU counts all of its memory);
/// revenue is what tenants were charged that day; utilisation is the mean of the agents'
/// samples (percent), absent without samples.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct DailyReport {
    pub date: NaiveDate,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub totals: DayTotals,
    pub tenants: Vec<TenantUsage>,
    pub nodes: Vec<NodeUsage>,
    pub gpus: Vec<GpuUsage>,
    /// The reservations that held GPUs that day, their times clipped to it, in start order.
    pub timeline: Vec<TimelineEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct DayTotals {
    pub gpus: u32,
    pub gpu_hours: f64,
    pub vram_gb_hours: f64,
    pub revenue: Money,
    pub host_earnings: Money,
    /// GPU-hours rented over the GPU-hours the fleet had (percent).
    pub allocation_pct: f64,
    pub utilization_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TenantUsage {
    pub tenant_id: String,
    pub tenant: String,
    pub reservations: u32,
    pub gpu_hours: f64,
    pub vram_gb_hours: f64,
    pub revenue: Money,
    /// The utilisation of the GPUs it held while it held them, weighted by GPU-time.
    pub utilization_pct: Option<f64>,
    /// A team: its members' work for it is counted here, not under their own names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub team: bool,
    /// For a team, what each member made for it, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberUsage>,
}

/// What one member made for a team within the report's day.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct MemberUsage {
    pub member: String,
    pub reservations: u32,
    pub gpu_hours: f64,
    pub revenue: Money,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NodeUsage {
    pub node_id: String,
    pub node: String,
    pub gpus: u32,
    pub gpu_hours: f64,
    pub vram_gb_hours: f64,
    pub revenue: Money,
    /// The owner's share of that revenue, paid that day.
    pub host_earnings: Money,
    pub allocation_pct: f64,
    pub utilization_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct GpuUsage {
    pub uuid: String,
    pub node: String,
    pub index: u32,
    pub model: String,
    pub vram_mb: u64,
    pub gpu_hours: f64,
    pub vram_gb_hours: f64,
    /// Its reservations' revenue, a multi-GPU reservation's split evenly over its GPUs.
    pub revenue: Money,
    pub allocation_pct: f64,
    pub utilization_pct: Option<f64>,
    /// The 24 hours of the day, 00:00 first.
    pub hours: Vec<GpuHourUsage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct GpuHourUsage {
    /// 0 to 23 (UTC).
    pub hour: u32,
    /// Memory held by reservations, averaged over the hour.
    pub allocated_mb: u64,
    /// Memory in use by the agent's samples, their mean and maximum.
    pub used_mb: Option<u64>,
    pub used_max_mb: Option<u64>,
    pub utilization_pct: Option<f64>,
    pub samples: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TimelineEntry {
    pub reservation_id: String,
    pub tenant: String,
    pub node: Option<String>,
    pub gpus: Vec<String>,
    pub tier: Tier,
    pub status: ReservationStatus,
    /// The share's memory; absent for whole GPUs.
    pub vram_mb: Option<u64>,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Still holding its GPUs at `end`.
    pub ongoing: bool,
    /// The member who made it, where it is a team's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_by: Option<String>,
}

/// Seven UTC days compared per price tier.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct WeeklyReport {
    /// The ISO week (`2026-W09`) when the window is one.
    pub week: Option<String>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Every tier, in the order on-demand, stepped, spot, reserved.
    pub tiers: Vec<TierUsage>,
    pub total: TierUsage,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TierUsage {
    /// The tier; absent on the total.
    pub tier: Option<Tier>,
    /// Reservations that held GPUs or were charged in the week.
    pub reservations: u32,
    pub gpu_hours: f64,
    /// What tenants were charged in the week.
    pub charged: Money,
    /// `charged` per GPU-hour; absent without GPU-hours.
    pub price_per_gpu_hour: Option<Money>,
    /// Reservations of the tier preempted in the week.
    pub preemptions: u32,
    /// The hosts' share of `charged`.
    pub host_earnings: Money,
    /// What the platform kept: `charged` minus `host_earnings`.
    pub platform_return: Money,
}
