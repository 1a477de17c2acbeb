use chrono::{TimeZone, Utc};
use proptest::prelude::*;

use super::*;

fn money(s: &str) -> Money {
    s.parse().unwrap()
}

#[test]
fn thresholds_are_reached_at_their_exact_share_and_never_below() {
    let b = Budget::new(money("500"), &[100, 50, 80, 50], false, 24).unwrap();
    assert_eq!(b.alert_at, vec![50, 80, 100]);
    assert_eq!(b.reached(money("249.999999")), Vec::<u32>::new());
    assert_eq!(b.reached(money("250")), vec![50]);
    assert_eq!(b.reached(money("400")), vec![50, 80]);
    assert!(!b.is_over(money("499.999999")));
    assert!(b.is_over(money("500")));
    assert_eq!(b.reached(money("500")), vec![50, 80, 100]);
    // A third of 0.000001 is rounded up: reached only once it is spent.
    let tiny = Budget::new(Money::from_micros(1), &[33], false, 0).unwrap();
    assert_eq!(tiny.threshold_amount(33), Money::from_micros(1));
}

#[test]
fn bad_budgets_say_why() {
    assert_eq!(
        Budget::new(Money::ZERO, &[50], false, 24),
        Err(BudgetError::NotPositive)
    );
    assert_eq!(
        Budget::new(money("1"), &[0], false, 24),
        Err(BudgetError::Threshold(0))
    );
    assert_eq!(
        Budget::new(money("1"), &[1001], false, 24),
        Err(BudgetError::Threshold(1001))
    );
    let many: Vec<u32> = (1..=11).collect();
    assert_eq!(
        Budget::new(money("1"), &many, false, 24),
        Err(BudgetError::TooManyThresholds)
    );
    assert_eq!(
        Budget::new(money("1"), &[50], false, 745),
        Err(BudgetError::LowBalanceHours)
    );
}

#[test]
fn months_and_the_forecast_are_utc_calendar_months() {
    let now = Utc.with_ymd_and_hms(2026, 12, 31, 23, 0, 0).unwrap();
    let (first, next, key) = month_of(now);
    assert_eq!(key, "2026-12");
    assert_eq!(first, Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap());
    assert_eq!(next, Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap());
    // One hour left at 2.50/h.
    assert_eq!(forecast(money("10"), money("2.5"), now), money("12.5"));
    // A second left at 1.00/h: 1/3600 rounded up to the micro-unit.
    let last = Utc.with_ymd_and_hms(2026, 11, 30, 23, 59, 59).unwrap();
    assert_eq!(
        forecast(Money::ZERO, money("1"), last),
        Money::from_micros(278)
    );
}

#[test]
fn a_balance_is_low_below_its_hours_of_burn() {
    let b = Budget::new(money("100"), &[], false, 24).unwrap();
    assert!(b.is_low(money("23.99"), money("1")));
    assert!(!b.is_low(money("24"), money("1")));
    assert!(!b.is_low(Money::ZERO, Money::ZERO), "nothing burns");
    let off = Budget::new(money("100"), &[], false, 0).unwrap();
    assert!(!off.is_low(Money::ZERO, money("1")));
}

proptest! {
    /// Reaching is monotone in spend, and a threshold is reached exactly when the spend is
    /// at least its share of the budget (compared in exact integers).
    #[test]
    fn reached_is_exact_and_monotone(
        monthly in 1i64..10_000_000_000,
        percents in proptest::collection::vec(1u32..=1000, 0..10),
        a in 0i64..20_000_000_000,
        b in 0i64..20_000_000_000,
    ) {
        let budget = Budget::new(Money::from_micros(monthly), &percents, false, 0).unwrap();
        let (lo, hi) = (a.min(b), a.max(b));
        let at_lo = budget.reached(Money::from_micros(lo));
        let at_hi = budget.reached(Money::from_micros(hi));
        prop_assert!(at_lo.iter().all(|p| at_hi.contains(p)));
        for p in &budget.alert_at {
            let exact = i128::from(hi) * 100 >= i128::from(monthly) * i128::from(*p);
            prop_assert_eq!(at_hi.contains(p), exact);
        }
        prop_assert_eq!(budget.is_over(Money::from_micros(hi)), hi >= monthly);
    }

    /// The forecast is the spend plus the burn for what is left of the month, never less
    /// than the spend, and it grows with the burn.
    #[test]
    fn forecasts_add_the_rest_of_the_month(
        spent in 0i64..1_000_000_000_000,
        burn in 0i64..100_000_000_000,
        secs in 0i64..(400 * 86_400),
    ) {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::seconds(secs);
        let (_, end, _) = month_of(now);
        let left = (end - now).num_seconds();
        prop_assert!(left > 0 && left <= 31 * 86_400);
        let f = forecast(Money::from_micros(spent), Money::from_micros(burn), now).micros();
        let exact = i128::from(spent) * 3600 + i128::from(burn) * i128::from(left);
        // f is exact/3600 rounded up.
        prop_assert!(i128::from(f) * 3600 >= exact);
        prop_assert!(i128::from(f - 1) * 3600 < exact);
        let more = forecast(Money::from_micros(spent), Money::from_micros(burn + 1), now).micros();
        prop_assert!(more >= f);
    }
}
