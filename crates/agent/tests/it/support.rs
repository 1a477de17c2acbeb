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
