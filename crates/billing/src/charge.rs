//! Per-second charges: running seconds × price per hour / 3600, in micro-units.

use gpurent_types::Money;

use crate::rate::Rate;

/// The charge for `seconds` of running at `price_per_hour`, rounded down to the micro-unit
/// (a tenant is never charged for a fraction of a micro-unit they did not use).
pub fn charge_for_seconds(price_per_hour: Money, seconds: u64) -> Money {
    Rate::flat(price_per_hour).charge_for_seconds(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn seeds_4090_example() {
        let price = Money::from_micros(2_500_000);
        assert_eq!(charge_for_seconds(price, 3600), price);
        assert_eq!(charge_for_seconds(price, 10).micros(), 6_944);
        assert_eq!(charge_for_seconds(price, 0), Money::ZERO);
        // 72 h of four GPUs at 2.50 each.
        assert_eq!(
            charge_for_seconds(price.checked_mul(4).unwrap_or_default(), 72 * 3600),
            Money::units(720)
        );
    }

    proptest! {
        /// Charging in pieces never charges more than charging at once, and loses less than
        /// one micro-unit per piece.
        #[test]
        fn split_charges_stay_within_a_micro_per_piece(
            price in 0i64..1_000_000_000,
            pieces in proptest::collection::vec(0u64..100_000, 1..20),
        ) {
            let price = Money::from_micros(price);
            let total: u64 = pieces.iter().sum();
            let whole = charge_for_seconds(price, total).micros();
            let split: i64 = pieces.iter().map(|s| charge_for_seconds(price, *s).micros()).sum();
            prop_assert!(split <= whole);
            prop_assert!(whole - split < i64::try_from(pieces.len()).unwrap_or(i64::MAX));
        }

        /// Settling at any sequence of times, then at the end, charges exactly the whole time.
        #[test]
        fn settlements_add_up_to_the_whole(
            price in 0i64..100_000_000,
            mut times in proptest::collection::vec(0u64..1_000_000, 0..30),
            end in 0u64..1_000_000,
        ) {
            let price = Money::from_micros(price);
            times.push(end);
            times.sort_unstable();
            let mut charged = Money::ZERO;
            for t in &times {
                let due = Rate::flat(price).charge_due(*t, charged);
                prop_assert!(!due.is_negative());
                charged = charged.checked_add(due).unwrap_or(charged);
            }
            prop_assert_eq!(charged, charge_for_seconds(price, end.max(*times.last().unwrap_or(&0))));
        }

        #[test]
        fn charge_is_monotonic(price in 0i64..1_000_000_000, a in 0u64..10_000_000, b in 0u64..10_000_000) {
            let price = Money::from_micros(price);
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(charge_for_seconds(price, lo) <= charge_for_seconds(price, hi));
        }
    }
}
