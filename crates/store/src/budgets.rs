//! Monthly budgets: the store's side of `gpurent budget` (`BudgetStore`, implemented in
//! `sql/budgets.rs`). What a month has spent and burns, the alerts fired once each, and the
//! refusal and stops at the limit; what is over and what to fire is `billing::budget`'s.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_billing::budget::Budget;
use gpurent_types::Money;

use crate::Result;

/// A tenant's budget as kept, with its month's facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetFacts {
    pub tenant_id: String,
    pub budget: Budget,
    /// Charges (reservations and storage) since the month began, as last settled.
    pub spent: Money,
    /// What its live reservations cost per hour now.
    pub burn_per_hour: Money,
    pub balance: Money,
    /// The alerts fired this month: (alert, spent then, when).
    pub fired: Vec<(String, Money, DateTime<Utc>)>,
    /// Whether its new reservations are refused this month.
    pub over: bool,
}

#[async_trait]
pub trait BudgetStore: Send + Sync {
    /// Sets (or replaces) the tenant's budget.
    async fn set_budget(&self, tenant_id: &str, budget: &Budget, now: DateTime<Utc>) -> Result<()>;

    /// Removes it (and the refusal with it); whether there was one.
    async fn remove_budget(&self, tenant_id: &str) -> Result<bool>;

    /// The tenant's budget and its facts for the month of `now`; `None` without a budget.
    async fn budget_facts(
        &self,
        tenant_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<BudgetFacts>>;

    /// The ids of every tenant with a budget.
    async fn budget_tenants(&self) -> Result<Vec<String>>;

    /// Records `alert` fired for the tenant in `month` at `spent`; false when it already was
    /// (by this replica or another).
    async fn fire_budget_alert(
        &self,
        tenant_id: &str,
        month: &str,
        alert: &str,
        spent: Money,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Marks the tenant over its budget in `month` (its new reservations refused), or not
    /// (`None`).
    async fn set_over_budget(&self, tenant_id: &str, month: Option<&str>) -> Result<()>;

    /// Stops the tenant's running reservations but its reserved blocks (end reason `budget`);
    /// the nodes to wake.
    async fn stop_for_budget(&self, tenant_id: &str, now: DateTime<Utc>) -> Result<Vec<String>>;
}
