//! The books: the ledger check, usage, invoices, hosts' earnings and spot outcomes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Money, Tier};

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
    /// What each volume was charged.
    #[serde(default)]
    pub volumes: Vec<VolumeUsage>,
    pub days: Vec<DayUsage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct VolumeUsage {
    pub volume_id: String,
    pub name: String,
    pub charged: Money,
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
    /// One line per volume charged in the month.
    #[serde(default)]
    pub storage: Vec<StorageLine>,
    pub total: Money,
}

/// One volume's charges within an invoice's month.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct StorageLine {
    pub volume_id: String,
    pub name: String,
    /// Its size now (a resize within the month is charged at each size for its time).
    pub size_bytes: u64,
    pub price_per_gb_month: Money,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<DateTime<Utc>>,
    pub amount: Money,
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
