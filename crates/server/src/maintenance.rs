//! The periodic work of the control plane: settling running reservations every period,
//! expiring those whose time is up, the scheduling pass over queued reservations (also run
//! at once when woken), forgetting day-old idempotency keys, and elastic capacity (when due).

use tokio::sync::watch;

use crate::error::ApiError;
use crate::state::AppState;

pub(crate) async fn tick(state: &AppState) -> Result<(), ApiError> {
    let now = state.now();
    let settled = state
        .store
        .settle_due(now, state.config.settlement_period)
        .await?;
    for node in settled.stopped_on {
        state.wake.wake(&node);
    }
    let nodes = state.store.expire_due(now).await?;
    for node in nodes {
        state.wake.wake(&node);
    }
    crate::scheduler::pass(state).await?;
    let pruned = state
        .store
        .prune_idempotency_keys(now - crate::idempotency::KEEP_KEYS)
        .await?;
    if pruned > 0 {
        tracing::debug!(pruned, "forgot day-old idempotency keys");
    }
    crate::elastic::tick(state).await
}

pub(crate) async fn run(state: AppState, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(state.config.maintenance_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let woken = tokio::select! {
            _ = interval.tick() => false,
            () = state.wake.scheduler_woken() => true,
            changed = stopped.changed() => {
                if changed.is_err() {
                    return;
                }
                false
            }
        };
        if *stopped.borrow() {
            return;
        }
        // Woken by freed capacity: only the scheduling pass, not a whole tick.
        let done = if woken {
            crate::scheduler::pass(&state).await
        } else {
            tick(&state).await
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "maintenance pass failed; retrying next tick");
        }
    }
}
