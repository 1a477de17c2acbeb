//! Observing an executor from a test.

use std::time::Duration;

use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::Executor;

pub async fn state_of(e: &dyn Executor, id: &str) -> Option<ObservedState> {
    e.list()
        .await
        .unwrap()
        .into_iter()
        .find(|o| o.reservation_id == id)
        .map(|o| o.state)
}

/// Polls for up to 10 s until the instance is in `want`.
pub async fn wait_for(e: &dyn Executor, id: &str, want: ObservedState) {
    for _ in 0..400 {
        if state_of(e, id).await == Some(want.clone()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "{id} never reached {want:?}; now {:?}",
        state_of(e, id).await
    );
}

/// The process id a workload wrote to `path`, once it has.
pub async fn read_pid(path: &std::path::Path) -> i32 {
    for _ in 0..200 {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no process id in {} after 4 s", path.display());
}
