//! The rule of login throttling per account: how long an account's next try waits after its
//! failures, and when its failures are a burst for the admin. Pure; the store applies it.

use chrono::{DateTime, Duration, Utc};

/// Tries that fail before any wait.
pub const FREE_TRIES: u32 = 5;
/// The first wait, after the fifth failure; each further failure doubles it.
pub const FIRST_WAIT: Duration = Duration::seconds(30);
/// The longest wait.
pub const MAX_WAIT: Duration = Duration::minutes(15);
/// Failures are forgotten after this long without one.
pub const FORGET_AFTER: Duration = Duration::hours(24);
/// This many refused tries (wrong passwords, and tries during a wait) of one account ...
pub const BURST: u32 = 20;
/// ... within this long are a burst: an event for the admin.
pub const BURST_WINDOW: Duration = Duration::minutes(10);

/// What is kept of one account's recent failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    /// Tries counted since the last success (a try is counted when it starts: a success
    /// forgets it with the rest).
    pub failures: u32,
    /// The last counted try.
    pub last_at: DateTime<Utc>,
    /// No try before this is checked.
    pub wait_until: Option<DateTime<Utc>>,
    /// When the current burst window began, and the refused tries in it.
    pub window_start: DateTime<Utc>,
    pub window_tries: u32,
}

/// What a try gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Check the password (the try is counted as a failure until it succeeds).
    Check,
    /// Refused without checking anything until `until`.
    Wait { until: DateTime<Utc> },
}

/// The outcome of one try: the verdict, what to keep, and whether it makes a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub next: Attempts,
    /// This try is the `BURST`th refused one in the window: raise an event, once per window.
    pub burst: bool,
}

/// The wait after `failures` counted failures: none before `FREE_TRIES`, then `FIRST_WAIT`
/// doubling up to `MAX_WAIT`.
pub fn wait_after(failures: u32) -> Duration {
    if failures < FREE_TRIES {
        return Duration::zero();
    }
    let doublings = (failures - FREE_TRIES).min(16);
    FIRST_WAIT
        .checked_mul(1_i32 << doublings)
        .map_or(MAX_WAIT, |w| w.min(MAX_WAIT))
}

/// A try at `now` of an account with `prev` kept (none: no failure kept).
pub fn attempt(prev: Option<Attempts>, now: DateTime<Utc>) -> Decision {
    let prev = prev.filter(|p| now < p.last_at + FORGET_AFTER);
    let (window_start, window_tries) = match prev {
        Some(p) if now < p.window_start + BURST_WINDOW && now >= p.window_start => {
            (p.window_start, p.window_tries.saturating_add(1))
        }
        _ => (now, 1),
    };
    let burst = window_tries == BURST;
    if let Some(p) = prev {
        if let Some(until) = p.wait_until.filter(|u| now < *u) {
            return Decision {
                verdict: Verdict::Wait { until },
                next: Attempts {
                    window_start,
                    window_tries,
                    ..p
                },
                burst,
            };
        }
    }
    let failures = prev.map_or(0, |p| p.failures).saturating_add(1);
    let wait = wait_after(failures);
    Decision {
        verdict: Verdict::Check,
        next: Attempts {
            failures,
            last_at: now,
            wait_until: (wait > Duration::zero()).then_some(now + wait),
            window_start,
            window_tries,
        },
        burst,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    #[test]
    fn five_free_tries_then_a_doubling_wait() {
        let mut kept = None;
        let now = t0();
        for n in 1..=FREE_TRIES {
            let d = attempt(kept, now);
            assert_eq!(d.verdict, Verdict::Check, "try {n}");
            kept = Some(d.next);
        }
        let until = now + FIRST_WAIT;
        assert_eq!(kept.unwrap().wait_until, Some(until));
        // During the wait: refused, and the wait does not grow.
        let d = attempt(kept, now + Duration::seconds(29));
        assert_eq!(d.verdict, Verdict::Wait { until });
        assert_eq!(d.next.wait_until, Some(until));
        assert_eq!(d.next.failures, FREE_TRIES);
        // After it: checked again, and the next wait is twice as long.
        let d = attempt(Some(d.next), until);
        assert_eq!(d.verdict, Verdict::Check);
        assert_eq!(d.next.wait_until, Some(until + FIRST_WAIT * 2));
    }

    #[test]
    fn waits_double_up_to_fifteen_minutes() {
        let waits: Vec<i64> = (4..=12).map(|n| wait_after(n).num_seconds()).collect();
        assert_eq!(waits, [0, 30, 60, 120, 240, 480, 900, 900, 900]);
        assert_eq!(wait_after(u32::MAX), MAX_WAIT);
    }

    #[test]
    fn failures_are_forgotten_after_a_quiet_day() {
        let mut kept = None;
        for _ in 0..10 {
            kept = Some(attempt(kept, t0()).next);
        }
        let d = attempt(kept, t0() + FORGET_AFTER);
        assert_eq!(d.verdict, Verdict::Check);
        assert_eq!(d.next.failures, 1);
    }

    #[test]
    fn a_burst_is_raised_once_per_window() {
        let mut kept = None;
        let mut raised = 0;
        for s in 0..100 {
            let d = attempt(kept, t0() + Duration::seconds(s));
            raised += u32::from(d.burst);
            kept = Some(d.next);
        }
        assert_eq!(raised, 1, "100 tries within 100 s are one burst");
        let d = attempt(kept, t0() + BURST_WINDOW);
        assert_eq!(d.next.window_tries, 1, "a new window");
    }

    proptest! {
        /// Whatever the tries, one checked try is never followed by another before the wait
        /// that the failures so far call for, and the wait never exceeds `MAX_WAIT`: an
        /// attacker gets `FREE_TRIES` guesses, then one per wait.
        #[test]
        fn no_guess_is_checked_during_a_wait(gaps in proptest::collection::vec(0i64..2000, 1..80)) {
            let mut now = t0();
            let mut kept: Option<Attempts> = None;
            let mut last_check: Option<(DateTime<Utc>, u32)> = None;
            for gap in gaps {
                now += Duration::seconds(gap);
                let d = attempt(kept, now);
                if let Some(until) = d.next.wait_until {
                    prop_assert!(until - now <= MAX_WAIT);
                }
                if d.verdict == Verdict::Check {
                    if let Some((at, failures)) = last_check {
                        if now < at + FORGET_AFTER {
                            prop_assert!(now - at >= wait_after(failures));
                        }
                    }
                    last_check = Some((now, d.next.failures));
                } else {
                    prop_assert_eq!(d.next.failures, kept.map_or(0, |k| k.failures));
                }
                kept = Some(d.next);
            }
        }

        /// The owner is never locked out for good: once the wait is over, a try is checked.
        #[test]
        fn the_wait_always_ends(failures in 0u32..10_000) {
            let kept = Attempts {
                failures,
                last_at: t0(),
                wait_until: Some(t0() + wait_after(failures)),
                window_start: t0(),
                window_tries: failures,
            };
            let d = attempt(Some(kept), t0() + MAX_WAIT);
            prop_assert_eq!(d.verdict, Verdict::Check);
        }
    }
}
