//! The periodic work of the control plane: fencing nodes not heard from for the node TTL
//! (their work rescheduled by the same tick's scheduling pass), settling running reservations and volumes every period,
//! expiring those whose time is up, the scheduling pass over queued reservations (also run
//! at once when woken), forgetting day-old idempotency keys, pruning reservations' output and
//! the audit trail (hourly) past their retention, and elastic capacity (when due).

use tokio::sync::watch;

use crate::jobs::JobError;
use crate::state::AppState;

/// One whole pass, fencing included (tests call this after moving the clock).
pub(crate) async fn tick(state: &AppState) -> Result<(), JobError> {
    pass(state, Fence::Now).await
}

/// Whether a pass fences the nodes not heard from for the node TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fence {
    Now,
    /// The store has not answered every pass for a node TTL yet: heartbeats may have gone
    /// unwritten for want of it, not of the nodes.
    NotYet,
}

async fn pass(state: &AppState, fence: Fence) -> Result<(), JobError> {
    let now = state.now();
    // Before settlement, so that no period is charged past a lost node's fence time.
    if fence == Fence::Now {
        fence_lost_nodes(state, now).await?;
    }
    let settled = state
        .store
        .settle_due(now, state.config.settlement_period)
        .await?;
    for node in settled.stopped_on {
        state.wake.wake(&node);
    }
    state
        .store
        .settle_volumes(now, state.config.settlement_period)
        .await?;
    // After settlement: the month's spend is as fresh as it gets.
    // Neither holds up the rest of the tick when it fails: logged, tried at the next one.
    if let Err(e) = crate::budgets::pass::run(state, now).await {
        tracing::warn!(error = %e, "the budget pass failed; it runs again at the next tick");
    }
    if let Err(e) = crate::notifications::events::tick(state, now).await {
        tracing::warn!(error = %e, "notifications: the events could not be read; again at the next tick");
    }
    let nodes = state.store.expire_due(now).await?;
    for node in nodes {
        state.wake.wake(&node);
    }
    if let Some(idle) = state.live().idle_reclaim {
        let since = chrono::Duration::from_std(idle)
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        for node in state.store.reclaim_idle(since, now).await? {
            state.wake.wake(&node);
        }
    }
    crate::jobs::scheduler::pass(state).await?;
    crate::jobs::alerts::deliver(state).await;
    let pruned = state
        .store
        .prune_idempotency_keys(now - crate::idempotency::KEEP_KEYS)
        .await?;
    if pruned > 0 {
        tracing::debug!(pruned, "forgot day-old idempotency keys");
    }
    let pruned = state
        .store
        .prune_tokens(now - crate::auth::KEEP_DEAD_TOKENS)
        .await?;
    if pruned > 0 {
        tracing::debug!(pruned, "forgot tokens expired or revoked a month ago");
    }
    let forget = now - gpurent_types::login_throttle::FORGET_AFTER;
    let pruned = state
        .store
        .prune_login_throttle(forget, crate::reauth::KEEP_UNKNOWN_NAMES)
        .await?;
    if pruned > 0 {
        tracing::debug!(pruned, "forgot failed logins");
    }
    let pruned = state
        .store
        .prune_gpu_hours(now - crate::report::KEEP_TELEMETRY)
        .await?;
    if pruned > 0 {
        tracing::debug!(pruned, "forgot the telemetry rollup of old hours");
    }
    let keep =
        chrono::Duration::from_std(state.config.log_retention).unwrap_or(chrono::Duration::MAX);
    let before = now
        .checked_sub_signed(keep)
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
    let pruned = state.store.prune_logs(before).await?;
    if pruned > 0 {
        tracing::info!(pruned, %before, "pruned the output of reservations ended before the log retention");
    }
    crate::audit::prune(state, now).await?;
    crate::jobs::elastic::tick(state).await
}

/// Fences the nodes whose heartbeats stopped; their agents are woken (a long poll still held
/// for one answers with its new desired state), and so is the scheduler.
async fn fence_lost_nodes(
    state: &AppState,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), JobError> {
    let fenced = state
        .store
        .fence_lost_nodes(state.config.node_ttl(), now)
        .await?;
    for node in &fenced.nodes {
        state.wake.wake(node);
    }
    state.metrics.observe_fencing(
        fenced.nodes.len(),
        fenced.rescheduled.len(),
        fenced.ended.len(),
    );
    if !fenced.rescheduled.is_empty() {
        tracing::info!(
            nodes = ?fenced.nodes,
            rescheduled = ?fenced.rescheduled,
            "reservations of lost nodes queued again"
        );
    }
    Ok(())
}

/// The loop: a pass every maintenance interval, the scheduling pass alone when woken. Nodes
/// are fenced only once this replica's store has answered every pass for a node TTL (and so
/// also a node TTL after it starts): while the database fails over no heartbeat can be
/// written, and fencing every node the moment it answers again would stop and reschedule the
/// whole fleet's work for the database's fault, not the nodes'.
pub(crate) async fn run(state: AppState, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(state.config.maintenance_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut answering_since = std::time::Instant::now();
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
            crate::jobs::scheduler::pass(&state).await
        } else if answering_since.elapsed() >= state.config.node_ttl() {
            pass(&state, Fence::Now).await
        } else {
            pass(&state, Fence::NotYet).await
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "maintenance pass failed; retrying next tick");
            answering_since = std::time::Instant::now();
        }
    }
}
