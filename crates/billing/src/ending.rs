//! How billing ends: the facts of a reservation and how it ended give what is charged (from its
//! hold or its balance), what is given back, what stays held and what its host earns. Every
//! ending the store records (an instance gone, a lost node, fencing, a drain, a preemption, a
//! queued reservation's end) is billed by [`bill`].

use gpurent_types::Money;

use crate::Rate;

const MICROS_PER_SECOND: i64 = 1_000_000;

/// How a reservation ended, as its bill sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ending {
    /// A stop was asked for: by its tenant, or on its account (idle reclaim, credit run out).
    Stopped,
    /// Its hours were up.
    Expired,
    /// Its workload ended by itself, with or without an error.
    Exited,
    /// Its agent stopped it over its workload (more GPU memory than its share).
    AgentStopped,
    /// Work of a higher priority took its GPUs (spot).
    Preempted,
    /// Its instance never started.
    FailedToStart,
    /// Its agent stopped it unasked and did not say why.
    StoppedByAgent,
    /// Its node was lost and its tenant chose to end it then.
    NodeLost,
    /// Its node was lost or drained, or a GPU it ran on is gone: this run is billed to then and
    /// the reservation waits to run elsewhere, keeping what it holds.
    Requeued,
    /// It ended while queued, before it ran again (stopped by its tenant, timed out).
    Unplaced,
}

impl Ending {
    /// Every ending, for tests that must cover each.
    pub const ALL: [Ending; 10] = [
        Ending::Stopped,
        Ending::Expired,
        Ending::Exited,
        Ending::AgentStopped,
        Ending::Preempted,
        Ending::FailedToStart,
        Ending::StoppedByAgent,
        Ending::NodeLost,
        Ending::Requeued,
        Ending::Unplaced,
    ];

    /// The platform, not the tenant or its workload, cut it short: a prepaid block then pays
    /// only for the seconds it ran, and the rest of it is given back.
    pub fn platform_caused(self) -> bool {
        matches!(
            self,
            Ending::FailedToStart | Ending::StoppedByAgent | Ending::NodeLost | Ending::Requeued
        )
    }

    /// The reservation ends (its hold is settled to nothing), rather than only this run of it.
    pub fn is_final(self) -> bool {
        self != Ending::Requeued
    }
}

/// What an ending's bill is computed from: the reservation's price and times, and what its
/// meter says so far. Times are unix microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub rate: Rate,
    /// A reserved block: paid for whole, out of its hold, unless the platform cut it short.
    pub prepaid_block: bool,
    /// The seconds it was reserved for.
    pub duration_s: u64,
    /// Its effective start (moved back by the seconds earlier runs ran), while it runs.
    pub started_at: Option<i64>,
    /// The seconds its earlier runs, on nodes that were lost or drained, ran.
    pub run_before_s: u64,
    /// When a stop (its tenant's, an expiry, a preemption) ended its billing.
    pub stop_requested_at: Option<i64>,
    /// Charged so far, by settlements and earlier runs.
    pub charged: Money,
    /// Still held for it.
    pub held: Money,
    /// The host's share of its charges, in basis points.
    pub host_share_bps: u32,
}

/// What an ending moves. Conserved: `from_hold + released + held == Facts::held`, and
/// `charged == Facts::charged + from_hold + from_balance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bill {
    /// When its billing ended: when it ended or its stop was asked for, whichever came first,
    /// and never past its hours.
    pub ended_at: i64,
    /// Its hours ran out before it ended: billing ended at their end (an expiry).
    pub past_hours: bool,
    /// The seconds billed, over all its runs (a block spent whole: all of them).
    pub seconds: u64,
    /// Charged in all, once this bill is paid; never less than before.
    pub charged: Money,
    /// Charged now out of its hold (a block's).
    pub from_hold: Money,
    /// Charged now out of its tenant's balance.
    pub from_balance: Money,
    /// Given back from its hold to its tenant's balance.
    pub released: Money,
    /// Still held after (a run queued again).
    pub held: Money,
    /// Its host's share of what is charged now (rounded down once on the running total).
    pub earned: Money,
}

impl Bill {
    /// Charged now, from wherever.
    pub fn due(&self) -> Money {
        add(self.from_hold, self.from_balance)
    }

    /// The platform's part of what is charged now.
    pub fn fee(&self) -> Money {
        sub(self.due(), self.earned)
    }
}

/// The host's part of `charged` at `share_bps`, rounded down. Taken on a reservation's running
/// total, so that the shares paid at each settlement and at its end add up to the share of the
/// whole.
pub fn host_part(charged: Money, share_bps: u32) -> Money {
    let micros = i128::from(charged.micros()) * i128::from(share_bps) / 10_000;
    Money::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
}

/// When a reservation's billing ends, from its times alone (what [`bill`] bills).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// When its stop was asked for or it ended (`at`), whichever came first, never past its
    /// hours.
    pub at: i64,
    /// Its hours ran out before then: billing ended at their end (an expiry).
    pub past_hours: bool,
    /// The whole seconds it ran in all, up to then (those of earlier runs included).
    pub ran_s: u64,
}

/// When billing ends for a reservation that ended, or was noticed gone, at `at`; the store
/// reads it to tell an expiry before it bills.
pub fn end_of(facts: &Facts, at: i64) -> End {
    let deadline = facts.started_at.map(|s| {
        s.saturating_add(
            i64::try_from(facts.duration_s)
                .unwrap_or(i64::MAX)
                .saturating_mul(MICROS_PER_SECOND),
        )
    });
    let mut ended_at = facts.stop_requested_at.map_or(at, |t| t.min(at));
    let past_hours = deadline.is_some_and(|d| d < ended_at);
    if let Some(d) = deadline.filter(|_| past_hours) {
        ended_at = d;
    }
    let ran_s = facts.started_at.map_or(facts.run_before_s, |s| {
        u64::try_from(ended_at.saturating_sub(s).max(0) / MICROS_PER_SECOND).unwrap_or(0)
    });
    End {
        at: ended_at,
        past_hours,
        ran_s,
    }
}

/// The bill of a reservation that ended as `ending`, noticed at `at` (the instance's end
/// reported, the node's fence time, the drain).
///
/// Billing ends at the stop if one was asked for, else at `at`, and never past the
/// reservation's hours; the charge is the rate over the whole seconds run in all, or over
/// all its hours for a prepaid block its tenant or workload ended. Periodic settlements and
/// earlier runs charged part of it already: only the rest is charged now, never a negative
/// amount. A block is paid from its hold (any excess over it from the balance), anything else
/// from the balance. A final ending gives back whatever is left held; a run queued again
/// keeps it; a queued reservation's end charges nothing more.
pub fn bill(facts: &Facts, ending: Ending, at: i64) -> Bill {
    let End {
        at: ended_at,
        past_hours,
        ran_s,
    } = end_of(facts, at);
    let seconds = match ending {
        Ending::Unplaced => facts.run_before_s,
        e if facts.prepaid_block && e.is_final() && !e.platform_caused() => facts.duration_s,
        _ => ran_s,
    };
    let charged = match ending {
        Ending::Unplaced => facts.charged,
        _ => facts.rate.charge_for_seconds(seconds).max(facts.charged),
    };
    let due = sub(charged, facts.charged).max(Money::ZERO);
    let held = facts.held.max(Money::ZERO);
    let from_hold = if facts.prepaid_block {
        due.min(held)
    } else {
        Money::ZERO
    };
    let from_balance = sub(due, from_hold);
    let left = sub(held, from_hold);
    let (released, held) = if ending.is_final() {
        (left, Money::ZERO)
    } else {
        (Money::ZERO, left)
    };
    Bill {
        ended_at,
        past_hours,
        seconds,
        charged,
        from_hold,
        from_balance,
        released,
        held,
        earned: sub(
            host_part(charged, facts.host_share_bps),
            host_part(facts.charged, facts.host_share_bps),
        )
        .max(Money::ZERO),
    }
}

fn add(a: Money, b: Money) -> Money {
    Money::from_micros(a.micros().saturating_add(b.micros()))
}

fn sub(a: Money, b: Money) -> Money {
    Money::from_micros(a.micros().saturating_sub(b.micros()))
}

#[cfg(test)]
mod tests;
