//! The expected workload: the last requests for each GPU type, which placement keeps room
//! for (`gpurent_sched::plan`). Kept in memory by each control plane, empty after a restart
//! (placement is then best fit until requests come in again).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use gpurent_sched::Request;

/// How many recent requests per GPU type make the expected workload.
const RECENT_REQUESTS: usize = 256;

/// The requests seen lately per GPU type (by type key), newest last.
#[derive(Debug, Default)]
pub struct Expected(Mutex<HashMap<String, VecDeque<Request>>>);

impl Expected {
    /// Records `request` for `type_key`, whether or not it fits: the demand placement keeps
    /// room for next time. Returns the workload to plan it against, itself included.
    pub fn note(&self, type_key: &str, request: Request) -> Vec<Request> {
        // A panic elsewhere while this was held leaves a list that is still a valid history.
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let list = all.entry(type_key.to_owned()).or_default();
        if list.len() == RECENT_REQUESTS {
            list.pop_front();
        }
        list.push_back(request);
        list.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_requests_per_type() {
        let expected = Expected::default();
        for count in 1..=300 {
            expected.note("h100", Request::Whole { count });
        }
        let seen = expected.note("a10", Request::Share { vram_mb: 1024 });
        assert_eq!(seen, vec![Request::Share { vram_mb: 1024 }]);
        let seen = expected.note("h100", Request::Whole { count: 301 });
        assert_eq!(seen.len(), RECENT_REQUESTS);
        assert_eq!(seen.first(), Some(&Request::Whole { count: 46 }));
        assert_eq!(seen.last(), Some(&Request::Whole { count: 301 }));
    }
}
