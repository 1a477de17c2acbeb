//! What a volume costs: its provisioned size at a price per GB-month (GB = 10^9 bytes, a month
//! = 730 hours), pro rata per second. The charge for a stretch at one size is a running total
//! rounded down to the micro-unit once, so that charging it in pieces adds up exactly to the
//! charge for the whole; a resize starts a new stretch.

use gpurent_types::Money;

/// The seconds of a billing month: 730 hours, a year's twelfth.
pub const SECONDS_PER_MONTH: u64 = 730 * 3600;
/// Bytes in a billed GB.
pub const BYTES_PER_GB: u64 = 1_000_000_000;

/// The charge for `seconds` of a volume of `size_bytes` at `per_gb_month`.
pub fn storage_charge(per_gb_month: Money, size_bytes: u64, seconds: u64) -> Money {
    let micros = i128::from(per_gb_month.micros()) * i128::from(size_bytes) * i128::from(seconds)
        / (i128::from(BYTES_PER_GB) * i128::from(SECONDS_PER_MONTH));
    Money::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
}

/// What is due after `seconds` of a stretch of which `charged` was charged already.
pub fn storage_due(per_gb_month: Money, size_bytes: u64, seconds: u64, charged: Money) -> Money {
    let total = storage_charge(per_gb_month, size_bytes, seconds);
    Money::from_micros(total.micros().saturating_sub(charged.micros()).max(0))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_month_of_a_gb_costs_the_price() {
        let price = Money::from_micros(70_000);
        assert_eq!(
            storage_charge(price, BYTES_PER_GB, SECONDS_PER_MONTH),
            price
        );
        assert_eq!(
            storage_charge(price, 100 * BYTES_PER_GB, SECONDS_PER_MONTH),
            Money::from_micros(7_000_000)
        );
        // A second of 100 GB: 7 per 2,628,000 s, rounded down.
        assert_eq!(
            storage_charge(price, 100 * BYTES_PER_GB, 1),
            Money::from_micros(2)
        );
        assert_eq!(storage_charge(price, 0, SECONDS_PER_MONTH), Money::ZERO);
    }

    proptest! {
        #[test]
        fn pieces_add_up_to_the_whole(
            price in 0_i64..10_000_000,
            size in 0_u64..100_000_000_000_000,
            cuts in proptest::collection::vec(0_u64..10_000_000, 0..20),
        ) {
            let price = Money::from_micros(price);
            let mut at = 0;
            let mut charged = Money::ZERO;
            for step in cuts {
                at += step;
                let due = storage_due(price, size, at, charged);
                prop_assert!(!due.is_negative());
                charged = charged.checked_add(due).unwrap();
            }
            prop_assert_eq!(charged, storage_charge(price, size, at));
        }
    }
}
