//! The budget pass, after each settlement: for every tenant with a budget, its month's spend
//! against it (`billing::budget`): the thresholds reached fired once each, the refusal marked
//! or cleared, the running work stopped at the limit when asked, a low balance told.

use chrono::{DateTime, Utc};
use gpurent_billing::budget::month_of;

use crate::jobs::JobError;
use crate::notifications::events;
use crate::state::AppState;

/// The alert of a balance that covers less than its low-balance hours of spend.
pub(crate) const LOW_BALANCE: &str = "low_balance";

/// When this replica's pass last ran: spend changes only as settlement charges it, so a pass
/// runs once a settlement period (and at once for a budget just set), not every tick.
#[derive(Debug, Default)]
pub struct Pace {
    last: std::sync::Mutex<Option<DateTime<Utc>>>,
}

/// Every tenant with a budget, assessed at `now`, once a settlement period.
pub(crate) async fn run(state: &AppState, now: DateTime<Utc>) -> Result<(), JobError> {
    let period = chrono::Duration::from_std(state.config.settlement_period)
        .unwrap_or(chrono::Duration::minutes(1));
    {
        let Ok(mut last) = state.budget_pace.last.lock() else {
            return Ok(());
        };
        if last.is_some_and(|l| now < l + period) {
            return Ok(());
        }
        *last = Some(now);
    }
    for tenant in state.store.budget_tenants().await? {
        // One tenant's failure does not hold up the others'.
        if let Err(e) = assess(state, &tenant, now).await {
            tracing::warn!(%tenant, error = %e, "a budget could not be assessed; again at the next pass");
        }
    }
    Ok(())
}

/// One tenant's budget at `now`.
pub(crate) async fn assess(
    state: &AppState,
    tenant_id: &str,
    now: DateTime<Utc>,
) -> Result<(), gpurent_store::StoreError> {
    let Some(facts) = state.store.budget_facts(tenant_id, now).await? else {
        return Ok(());
    };
    let (_, _, month) = month_of(now);
    let budget = &facts.budget;
    for percent in budget.reached(facts.spent) {
        let alert = percent.to_string();
        if state
            .store
            .fire_budget_alert(tenant_id, &month, &alert, facts.spent, now)
            .await?
        {
            tracing::warn!(%tenant_id, %month, percent, spent = %facts.spent, monthly = %budget.monthly, "budget alert");
            let data = serde_json::json!({"month": month, "percent": percent,
                "spent": facts.spent, "monthly": budget.monthly});
            let key = format!("budget_alert:{month}:{percent}");
            events::queue(state, tenant_id, None, "budget_alert", &key, data, now).await?;
        }
    }
    if budget.is_low(facts.balance, facts.burn_per_hour)
        && state
            .store
            .fire_budget_alert(tenant_id, &month, LOW_BALANCE, facts.spent, now)
            .await?
    {
        tracing::warn!(%tenant_id, balance = %facts.balance, burn_per_hour = %facts.burn_per_hour, "low balance");
        let data = serde_json::json!({"balance": facts.balance, "burn_per_hour": facts.burn_per_hour,
            "low_balance_hours": budget.low_balance_hours});
        let key = format!("low_balance:{month}");
        events::queue(state, tenant_id, None, "low_balance", &key, data, now).await?;
    }
    let over = budget.is_over(facts.spent);
    if over != facts.over {
        let mark = over.then_some(month.as_str());
        state.store.set_over_budget(tenant_id, mark).await?;
    }
    if over && budget.stop_at_limit {
        let nodes = state.store.stop_for_budget(tenant_id, now).await?;
        if !nodes.is_empty() {
            tracing::info!(%tenant_id, nodes = nodes.len(), "budget spent: running reservations stopped");
        }
        for node in nodes {
            state.wake.wake(&node);
        }
    }
    Ok(())
}
