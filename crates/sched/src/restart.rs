//! Managed jobs: whether a run that ended is started again, by the job's restart policy, and how
//! long a failed one waits first. Pure: the store asks as it applies a run's end.

use gpurent_types::RestartPolicy;

/// The first wait before a failed run is started again; it doubles with each failure counted,
/// up to [`MAX_BACKOFF_S`].
pub const FIRST_BACKOFF_S: u64 = 5;
pub const MAX_BACKOFF_S: u64 = 300;
/// The most `max_restarts` a job may ask for.
pub const MAX_RESTARTS: u32 = 100;
/// What `max_restarts` is when a job does not say.
pub const DEFAULT_MAX_RESTARTS: u32 = 3;

/// How a run ended, as a restart policy tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Its command exited 0.
    Succeeded,
    /// Its command exited non-zero, it could not start, or its agent ended it for a reason of
    /// its own (over its GPU memory, unhealthy GPUs).
    Failed,
    /// Not the job's doing: preempted, its node lost or drained.
    Interrupted,
    /// Its tenant (or its credit, its budget, its hours) ended it: never started again.
    Stopped,
}

/// What becomes of the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Back to the queue, placed no sooner than `wait_s` from now; `counted` against its
    /// `max_restarts`.
    Restart { wait_s: u64, counted: bool },
    /// The run's end is the job's.
    End,
}

/// Whether a run that ended as `end` is started again, for a job with `policy` that has
/// already had `counted` restarts counted against its `max_restarts`.
pub fn decide(policy: RestartPolicy, max_restarts: u32, counted: u32, end: RunEnd) -> Decision {
    use RestartPolicy as P;
    let retries = match (policy, end) {
        (P::Never, _) | (_, RunEnd::Stopped) => false,
        (_, RunEnd::Interrupted) => {
            return Decision::Restart {
                wait_s: 0,
                counted: false,
            }
        }
        (P::OnFailure | P::Always, RunEnd::Failed) | (P::Always, RunEnd::Succeeded) => true,
        (P::OnInterruption, _) | (P::OnFailure, RunEnd::Succeeded) => false,
    };
    if !retries || counted >= max_restarts {
        return Decision::End;
    }
    Decision::Restart {
        wait_s: backoff_s(counted + 1),
        counted: true,
    }
}

/// The wait before the `n`th counted restart (1 for the first): 5 s, doubling, at most 5 min.
pub fn backoff_s(n: u32) -> u64 {
    let doublings = n.saturating_sub(1).min(16);
    FIRST_BACKOFF_S
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF_S)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> impl Strategy<Value = RestartPolicy> {
        prop::sample::select(RestartPolicy::ALL.to_vec())
    }

    fn end() -> impl Strategy<Value = RunEnd> {
        prop::sample::select(vec![
            RunEnd::Succeeded,
            RunEnd::Failed,
            RunEnd::Interrupted,
            RunEnd::Stopped,
        ])
    }

    proptest! {
        /// Runs that end by themselves are started again at most `max_restarts` times,
        /// whatever the policy and the interruptions between them, each after a wait that never
        /// shrinks; a stop is never undone, and `never` never restarts.
        #[test]
        fn a_job_never_loops(policy in policy(), max in 0..=MAX_RESTARTS, ends in prop::collection::vec(end(), 0..300)) {
            let mut counted = 0;
            let mut last_wait = 0;
            for end in ends {
                match decide(policy, max, counted, end) {
                    Decision::Restart { wait_s, counted: true } => {
                        prop_assert!(matches!(end, RunEnd::Failed | RunEnd::Succeeded));
                        prop_assert!(wait_s >= last_wait && (FIRST_BACKOFF_S..=MAX_BACKOFF_S).contains(&wait_s));
                        last_wait = wait_s;
                        counted += 1;
                    }
                    Decision::Restart { wait_s, counted: false } => {
                        prop_assert_eq!(end, RunEnd::Interrupted);
                        prop_assert_eq!(wait_s, 0);
                    }
                    Decision::End => {
                        prop_assert!(
                            policy == RestartPolicy::Never
                                || end == RunEnd::Stopped
                                || counted == max
                                || (end == RunEnd::Succeeded && policy != RestartPolicy::Always)
                                || (end == RunEnd::Failed && policy == RestartPolicy::OnInterruption)
                        );
                        break;
                    }
                }
                prop_assert!(counted <= max);
                prop_assert!(policy != RestartPolicy::Never);
                prop_assert!(end != RunEnd::Stopped);
            }
        }
    }

    #[test]
    fn what_each_policy_restarts() {
        use RestartPolicy as P;
        use RunEnd as E;
        let restarts = |p, e| decide(p, 3, 0, e) != Decision::End;
        for (policy, succeeded, failed, interrupted) in [
            (P::Never, false, false, false),
            (P::OnInterruption, false, false, true),
            (P::OnFailure, false, true, true),
            (P::Always, true, true, true),
        ] {
            assert_eq!(restarts(policy, E::Succeeded), succeeded, "{policy:?}");
            assert_eq!(restarts(policy, E::Failed), failed, "{policy:?}");
            assert_eq!(restarts(policy, E::Interrupted), interrupted, "{policy:?}");
            assert!(!restarts(policy, E::Stopped), "{policy:?}");
        }
        // The fourth failure of a job allowed three restarts ends it.
        assert_eq!(decide(P::OnFailure, 3, 3, E::Failed), Decision::End);
        // An interruption is restarted whatever was counted.
        assert_ne!(decide(P::OnFailure, 3, 3, E::Interrupted), Decision::End);
        assert_eq!(
            (1..=8).map(backoff_s).collect::<Vec<_>>(),
            [5, 10, 20, 40, 80, 160, 300, 300]
        );
    }
}
