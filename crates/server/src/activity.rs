//! Use of a running reservation that keeps idle reclaim away (input in an SSH session, a
//! request through a published port): recorded in the store at most once a minute per
//! reservation, however many sessions and requests there are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gpurent_store::Store;

/// How often a reservation's use is written.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// When each reservation's use last counted, in this process.
#[derive(Debug, Default)]
pub struct Activity {
    touched: Mutex<HashMap<String, Instant>>,
}

impl Activity {
    /// The reservation is in use now: written in the background when its last write is a
    /// minute old.
    pub fn touch(&self, store: &Arc<dyn Store>, reservation_id: &str, now: DateTime<Utc>) {
        if !self.due(reservation_id) {
            return;
        }
        let (store, id) = (Arc::clone(store), reservation_id.to_owned());
        tokio::spawn(async move {
            if let Err(e) = store.touch_reservation(&id, now).await {
                tracing::warn!(reservation = %id, error = %e, "cannot record the reservation's activity");
            }
        });
    }

    /// Whether the reservation's use is due to count again (and, if so, that it does now).
    fn due(&self, reservation_id: &str) -> bool {
        let now = Instant::now();
        let mut touched = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        if touched
            .get(reservation_id)
            .is_some_and(|t| now.duration_since(*t) < TOUCH_EVERY)
        {
            return false;
        }
        // Entries that are due anyway carry nothing: the map holds the last minute's only.
        touched.retain(|_, t| now.duration_since(*t) < TOUCH_EVERY);
        touched.insert(reservation_id.to_owned(), now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_counts_once_a_minute() {
        let a = Activity::default();
        assert!(a.due("r1"));
        assert!(!a.due("r1"));
        assert!(a.due("r2"), "each reservation has its own minute");
    }
}
