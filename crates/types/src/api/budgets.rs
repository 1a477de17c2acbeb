//! Monthly budgets (`gpurent budget`): the most a tenant (a user or a team) spends in a
//! calendar month, the alerts on the way there, and what happens at the limit.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Money;

/// The body of `PUT /api/v1/budget`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBudget {
    /// A team of the caller's (its admins and owners set it); default: the caller, or the team
    /// their token acts for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The most a calendar month (UTC) spends: reservations and storage.
    pub monthly: Money,
    /// Percentages of it at which an alert is sent, once each per month. Default 50, 80, 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_at: Option<Vec<u32>>,
    /// At the limit, stop running reservations (reserved blocks, already paid, never).
    #[serde(default)]
    pub stop_at_limit: bool,
    /// Alert when the balance covers fewer hours than this of current spend. Default 24; 0:
    /// never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_balance_hours: Option<u32>,
}

/// A budget and where its month stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BudgetStatus {
    pub tenant_id: String,
    /// The team's name, for a team's budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The month it stands for: `2026-12`.
    pub month: String,
    pub monthly: Money,
    pub alert_at: Vec<u32>,
    pub stop_at_limit: bool,
    pub low_balance_hours: u32,
    /// Charged this month, as of the last settlement.
    pub spent: Money,
    /// What its running reservations cost per hour now.
    pub burn_per_hour: Money,
    /// `spent` plus the burn for the rest of the month.
    pub forecast: Money,
    pub balance: Money,
    /// Whether new reservations are refused (402 `budget_exceeded`) for the rest of the month.
    pub over: bool,
    /// The alerts fired this month, oldest first.
    pub alerts: Vec<BudgetAlert>,
}

/// An alert fired: a threshold's percentage (`80`) or `low_balance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BudgetAlert {
    pub alert: String,
    /// What the month had spent then.
    pub spent: Money,
    pub fired_at: DateTime<Utc>,
}
