//! Other replicas' changes to the nodes' desired state, seen by this one: on PostgreSQL one read
//! of every node's version a second wakes the held syncs of the nodes whose version moved,
//! instead of each held sync reading its own version every second.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::watch;

use super::JobError;
use crate::state::AppState;

/// How often the versions are read: the longest another replica's change waits before a held
/// sync of this one answers it.
const EVERY: Duration = Duration::from_secs(1);

/// The versions as last read; wakes the held syncs of the nodes whose version is not the one
/// seen before (a node seen for the first time too: a sync may hold on it already).
#[derive(Debug, Default)]
struct Watcher {
    seen: HashMap<String, i64>,
}

impl Watcher {
    /// Reads every node's version once and wakes the nodes that changed.
    async fn pass(&mut self, state: &AppState) -> Result<(), JobError> {
        let versions = state.store.desired_versions().await?;
        let mut seen = HashMap::with_capacity(versions.len());
        for (node_id, version) in versions {
            if self.seen.get(&node_id) != Some(&version) {
                state.wake.wake(&node_id);
            }
            seen.insert(node_id, version);
        }
        self.seen = seen;
        Ok(())
    }
}

/// The loop, until the server stops. A failed read is logged and tried again at the next tick:
/// meanwhile a held sync answers at the end of its wait, and the next sync reads afresh.
pub(crate) async fn run(state: AppState, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watcher = Watcher::default();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            changed = stopped.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        if *stopped.borrow() {
            return;
        }
        if let Err(e) = watcher.pass(&state).await {
            tracing::warn!(error = %e, "reading the nodes' versions failed; retrying next tick");
        }
    }
}
