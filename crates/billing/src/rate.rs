//! How a reservation's charge grows with the seconds it runs: one hourly rate for a first
//! stretch, another after it (the duration-stepped tier); a flat price is the same rate twice.

use gpurent_types::Money;

const SECONDS_PER_HOUR: i128 = 3600;

/// `first` per hour for the first `step_s` seconds, `then` per hour after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub first: Money,
    pub step_s: u64,
    pub then: Money,
}

impl Rate {
    /// One price per hour all along.
    pub fn flat(per_hour: Money) -> Self {
        Rate {
            first: per_hour,
            step_s: u64::MAX,
            then: per_hour,
        }
    }

    /// The charge for `seconds` of running, rounded down to the micro-unit once, on the whole
    /// time (the store's settlement computes the same expression in SQL).
    pub fn charge_for_seconds(&self, seconds: u64) -> Money {
        let early = seconds.min(self.step_s);
        let late = seconds - early;
        let micros = (i128::from(self.first.micros()) * i128::from(early)
            + i128::from(self.then.micros()) * i128::from(late))
            / SECONDS_PER_HOUR;
        Money::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    /// The price per hour of the second after `seconds` of running: what the next period is
    /// charged at (the store's settlement computes the same in SQL).
    pub fn per_hour_after(&self, seconds: u64) -> Money {
        if seconds < self.step_s {
            self.first
        } else {
            self.then
        }
    }

    /// What is still owed for `seconds` of running when `already` was charged; never negative.
    pub fn charge_due(&self, seconds: u64, already: Money) -> Money {
        self.charge_for_seconds(seconds)
            .checked_sub(already)
            .filter(|d| !d.is_negative())
            .unwrap_or(Money::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_step_changes_the_rate_at_its_second() {
        let rate = Rate {
            first: Money::units(2),
            step_s: 3 * 3600,
            then: Money::from_micros(1_200_000),
        };
        assert_eq!(rate.charge_for_seconds(3600), Money::units(2));
        assert_eq!(rate.charge_for_seconds(3 * 3600), Money::units(6));
        assert_eq!(
            rate.charge_for_seconds(4 * 3600),
            Money::from_micros(7_200_000)
        );
        // One second after the step: 6.00 + 1.20/3600, rounded down once.
        assert_eq!(
            rate.charge_for_seconds(3 * 3600 + 1),
            Money::from_micros(6_000_333)
        );
    }

    proptest! {
        /// A step between two equal rates changes nothing.
        #[test]
        fn a_step_to_the_same_rate_is_flat(
            price in 0i64..1_000_000_000,
            step_s in 0u64..100_000,
            s in 0u64..40_000_000,
        ) {
            let price = Money::from_micros(price);
            let stepped = Rate { first: price, step_s, then: price };
            prop_assert_eq!(stepped.charge_for_seconds(s), Rate::flat(price).charge_for_seconds(s));
        }

        #[test]
        fn stepped_charges_grow_and_add_up(
            first in 0i64..100_000_000,
            then in 0i64..100_000_000,
            step_s in 0u64..100_000,
            mut times in proptest::collection::vec(0u64..1_000_000, 1..20),
        ) {
            let rate = Rate { first: Money::from_micros(first), step_s, then: Money::from_micros(then) };
            times.sort_unstable();
            let mut charged = Money::ZERO;
            let mut last = Money::ZERO;
            for t in &times {
                let total = rate.charge_for_seconds(*t);
                prop_assert!(total >= last);
                last = total;
                charged = charged.checked_add(rate.charge_due(*t, charged)).unwrap_or(charged);
            }
            prop_assert_eq!(charged, rate.charge_for_seconds(*times.last().unwrap_or(&0)));
        }
    }
}
