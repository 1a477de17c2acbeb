use proptest::prelude::*;

use super::*;

const HOUR_US: i64 = 3600 * MICROS_PER_SECOND;

/// Two hours at 3.60 an hour from t = 0, one hour held, nothing charged yet.
fn two_hours(prepaid_block: bool) -> Facts {
    Facts {
        rate: Rate::flat(Money::from_micros(3_600_000)),
        prepaid_block,
        duration_s: 7200,
        started_at: Some(0),
        run_before_s: 0,
        stop_requested_at: None,
        charged: Money::ZERO,
        held: if prepaid_block {
            Money::from_micros(7_200_000)
        } else {
            Money::from_micros(3_600_000)
        },
        host_share_bps: 8000,
    }
}

#[test]
fn an_on_demand_end_charges_the_seconds_run_from_the_balance_and_gives_the_hold_back() {
    let b = bill(&two_hours(false), Ending::Exited, HOUR_US / 2);
    assert_eq!(b.seconds, 1800);
    assert_eq!(b.charged, Money::from_micros(1_800_000));
    assert_eq!(b.from_balance, b.charged);
    assert_eq!(b.from_hold, Money::ZERO);
    assert_eq!(b.released, Money::from_micros(3_600_000));
    assert_eq!(b.held, Money::ZERO);
    assert_eq!(b.earned, Money::from_micros(1_440_000));
    assert_eq!(b.fee(), Money::from_micros(360_000));
    assert!(!b.past_hours);
}

#[test]
fn billing_ends_at_the_stop_not_when_the_agent_got_to_it() {
    let facts = Facts {
        stop_requested_at: Some(600 * MICROS_PER_SECOND),
        ..two_hours(false)
    };
    let b = bill(&facts, Ending::Stopped, HOUR_US);
    assert_eq!(b.ended_at, 600 * MICROS_PER_SECOND);
    assert_eq!(b.seconds, 600);
}

#[test]
fn nothing_is_billed_past_the_hours() {
    let b = bill(&two_hours(false), Ending::Exited, 3 * HOUR_US);
    assert!(b.past_hours);
    assert_eq!(b.ended_at, 2 * HOUR_US);
    assert_eq!(b.seconds, 7200);
}

#[test]
fn a_block_its_tenant_ends_is_spent_whole_and_one_the_platform_ends_gives_the_rest_back() {
    for ending in [Ending::Stopped, Ending::Exited, Ending::AgentStopped] {
        let b = bill(&two_hours(true), ending, HOUR_US / 2);
        assert_eq!(b.seconds, 7200, "{ending:?}");
        assert_eq!(b.from_hold, Money::from_micros(7_200_000));
        assert_eq!(b.released, Money::ZERO);
    }
    for ending in [
        Ending::FailedToStart,
        Ending::StoppedByAgent,
        Ending::NodeLost,
    ] {
        let b = bill(&two_hours(true), ending, HOUR_US / 2);
        assert_eq!(b.seconds, 1800, "{ending:?}");
        assert_eq!(b.from_hold, Money::from_micros(1_800_000));
        assert_eq!(b.released, Money::from_micros(5_400_000));
    }
}

#[test]
fn a_run_queued_again_is_billed_to_then_and_keeps_its_hold() {
    let b = bill(&two_hours(false), Ending::Requeued, HOUR_US / 4);
    assert_eq!(b.seconds, 900);
    assert_eq!(b.from_balance, Money::from_micros(900_000));
    assert_eq!(b.released, Money::ZERO);
    assert_eq!(b.held, Money::from_micros(3_600_000));
    // A block pays the run out of its hold, and keeps the rest for the next run.
    let b = bill(&two_hours(true), Ending::Requeued, HOUR_US / 4);
    assert_eq!(b.from_hold, Money::from_micros(900_000));
    assert_eq!(b.held, Money::from_micros(6_300_000));
}

#[test]
fn a_queued_reservation_that_ends_is_charged_nothing_more_and_gets_its_hold_back() {
    let facts = Facts {
        started_at: None,
        run_before_s: 900,
        charged: Money::from_micros(900_000),
        ..two_hours(true)
    };
    let b = bill(&facts, Ending::Unplaced, HOUR_US);
    assert_eq!(b.charged, Money::from_micros(900_000));
    assert_eq!(b.due(), Money::ZERO);
    assert_eq!(b.released, facts.held);
}

#[test]
fn settlements_that_charged_past_the_end_are_kept_and_nothing_is_paid_back() {
    let facts = Facts {
        charged: Money::from_micros(2_000_000),
        ..two_hours(false)
    };
    let b = bill(&facts, Ending::Stopped, HOUR_US / 2);
    assert_eq!(b.charged, Money::from_micros(2_000_000));
    assert_eq!(b.due(), Money::ZERO);
    assert_eq!(b.earned, Money::ZERO);
}

fn rate() -> impl Strategy<Value = Rate> {
    (
        0i64..100_000_000,
        0i64..100_000_000,
        prop::option::of(0u64..200_000),
    )
        .prop_map(|(first, then, step)| match step {
            Some(step_s) => Rate {
                first: Money::from_micros(first),
                step_s,
                then: Money::from_micros(then),
            },
            None => Rate::flat(Money::from_micros(first)),
        })
}

/// Facts as the store has them (what was settled is a part of the run, a block holds what
/// is left of its price, anything else its first hour or nothing), give or take a little, so
/// that the edges (a hold a little short, a settlement past the end) come up too.
fn facts() -> impl Strategy<Value = Facts> {
    (
        (rate(), any::<bool>(), 1u64..300_000),
        prop::option::of(0i64..1_000_000_000_000),
        (0u64..300_000, prop::option::of(0i64..2_000_000_000_000)),
        (0u64..=300_000, -1_000i64..1_000, 0i64..1_000, 0u32..=10_000),
    )
        .prop_map(
            |(
                (rate, prepaid_block, duration_s),
                started_at,
                (before, stop),
                (settled, off, short, bps),
            )| {
                let charged = rate
                    .charge_for_seconds(settled.min(duration_s + 60))
                    .micros()
                    + off;
                let charged = charged.max(0);
                let held = if prepaid_block {
                    rate.charge_for_seconds(duration_s).micros() - charged - short
                } else {
                    rate.charge_for_seconds(duration_s.min(3600)).micros() - short
                };
                Facts {
                    rate,
                    prepaid_block,
                    duration_s,
                    started_at,
                    run_before_s: before.min(duration_s),
                    stop_requested_at: stop,
                    charged: Money::from_micros(charged),
                    held: Money::from_micros(held.max(0)),
                    host_share_bps: bps,
                }
            },
        )
}

fn ending() -> impl Strategy<Value = Ending> {
    prop::sample::select(Ending::ALL.to_vec())
}

fn at() -> impl Strategy<Value = i64> {
    0i64..2_000_000_000_000
}

proptest! {
    /// Money is conserved: the hold is split into what is charged from it, given back and
    /// kept; the total charged grows by exactly what is charged now.
    #[test]
    fn the_hold_and_the_charge_add_up(f in facts(), e in ending(), at in at()) {
        let b = bill(&f, e, at);
        prop_assert_eq!(add(add(b.from_hold, b.released), b.held), f.held);
        prop_assert_eq!(add(f.charged, b.due()), b.charged);
        prop_assert!(!b.from_hold.is_negative() && !b.from_balance.is_negative());
        prop_assert!(!b.released.is_negative() && !b.held.is_negative());
        prop_assert!(b.charged >= f.charged);
    }

    /// A block's charge never exceeds its hold; anything else is not paid from the hold.
    #[test]
    fn only_a_block_pays_from_its_hold_and_never_more_than_it(f in facts(), e in ending(), at in at()) {
        let b = bill(&f, e, at);
        prop_assert!(b.from_hold <= f.held);
        if !f.prepaid_block {
            prop_assert_eq!(b.from_hold, Money::ZERO);
        } else if b.due() <= f.held {
            prop_assert_eq!(b.from_balance, Money::ZERO);
        }
    }

    /// The host earns its share of what is charged now, rounded down on the running total;
    /// the platform keeps the rest.
    #[test]
    fn earned_is_the_hosts_share_and_the_fee_the_rest(f in facts(), e in ending(), at in at()) {
        let b = bill(&f, e, at);
        prop_assert_eq!(
            b.earned,
            sub(host_part(b.charged, f.host_share_bps), host_part(f.charged, f.host_share_bps))
        );
        prop_assert!(b.earned <= b.due());
        prop_assert_eq!(add(b.earned, b.fee()), b.due());
    }

    /// A final ending leaves nothing held; a run queued again gives nothing back; a queued
    /// reservation's end charges nothing.
    #[test]
    fn what_each_ending_leaves_held(f in facts(), e in ending(), at in at()) {
        let b = bill(&f, e, at);
        if e.is_final() {
            prop_assert_eq!(b.held, Money::ZERO);
        } else {
            prop_assert_eq!(b.released, Money::ZERO);
        }
        if e == Ending::Unplaced {
            prop_assert_eq!(b.due(), Money::ZERO);
            prop_assert_eq!(b.released, f.held);
        }
    }

    /// Billing ends no later than it was noticed, its stop, or its hours; nothing is billed
    /// past the hours reserved.
    #[test]
    fn billing_never_runs_past_the_end_the_stop_or_the_hours(f in facts(), e in ending(), at in at()) {
        let b = bill(&f, e, at);
        prop_assert!(b.ended_at <= at);
        if let Some(stop) = f.stop_requested_at {
            prop_assert!(b.ended_at <= stop);
        }
        prop_assert!(b.seconds <= f.duration_s);
        let whole = f.rate.charge_for_seconds(f.duration_s).max(f.charged);
        prop_assert!(b.charged <= whole);
        if f.prepaid_block && e.is_final() && !e.platform_caused() && e != Ending::Unplaced {
            prop_assert_eq!(b.charged, whole);
        }
    }

    /// Settling part of the run first changes nothing about what it is charged in all.
    #[test]
    fn settlements_before_the_end_change_nothing(f in facts(), e in ending(), at in at(), part in 0u64..300_000) {
        prop_assume!(e != Ending::Unplaced);
        let fresh = Facts { charged: Money::ZERO, ..f };
        let whole = bill(&fresh, e, at);
        let settled = Facts {
            charged: f.rate.charge_for_seconds(part.min(whole.seconds)),
            ..fresh
        };
        let after = bill(&settled, e, at);
        prop_assert_eq!(after.charged, whole.charged);
        prop_assert_eq!(add(after.due(), settled.charged), whole.due());
        prop_assert_eq!(add(after.earned, host_part(settled.charged, f.host_share_bps)), whole.earned);
    }

    /// The platform cutting a reservation short never costs its tenant more than the
    /// tenant ending it would.
    #[test]
    fn a_platform_end_never_costs_more(f in facts(), at in at()) {
        let tenant = bill(&f, Ending::Stopped, at);
        for e in Ending::ALL.into_iter().filter(|e| e.platform_caused()) {
            prop_assert!(bill(&f, e, at).charged <= tenant.charged);
        }
    }
}
