//! Monthly budgets: which alert thresholds a month's spend has reached, whether it is over,
//! the forecast for the month at the current burn rate, and when a balance runs low. Exact, in
//! micro-units; the store records what fired and the server applies the stops.

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use gpurent_types::Money;

/// A tenant's monthly budget (`gpurent budget set`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The most a calendar month (UTC) may spend: charges for reservations and storage.
    pub monthly: Money,
    /// Percentages of `monthly` at which an alert is sent, once each per month.
    pub alert_at: Vec<u32>,
    /// At the limit, stop running reservations (never reserved blocks, already paid).
    pub stop_at_limit: bool,
    /// A low-balance alert when the balance covers less than this many hours of current spend;
    /// 0: none.
    pub low_balance_hours: u32,
}

/// Why a budget is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("a monthly budget must be more than zero")]
    NotPositive,
    #[error("alert thresholds are percentages from 1 to 1000; {0} is not")]
    Threshold(u32),
    #[error("at most {MAX_THRESHOLDS} alert thresholds")]
    TooManyThresholds,
    #[error("--low-balance-hours is at most {MAX_LOW_BALANCE_HOURS} (a month)")]
    LowBalanceHours,
}

/// The most alert thresholds a budget has.
pub const MAX_THRESHOLDS: usize = 10;
/// The longest low-balance horizon, in hours: 31 days.
pub const MAX_LOW_BALANCE_HOURS: u32 = 744;
/// The thresholds when none are given.
pub const DEFAULT_ALERT_AT: [u32; 3] = [50, 80, 100];
/// The low-balance horizon when none is given, in hours.
pub const DEFAULT_LOW_BALANCE_HOURS: u32 = 24;

impl Budget {
    /// A budget with its thresholds sorted and deduplicated, or why it cannot be.
    pub fn new(
        monthly: Money,
        alert_at: &[u32],
        stop_at_limit: bool,
        low_balance_hours: u32,
    ) -> Result<Budget, BudgetError> {
        if monthly.micros() <= 0 {
            return Err(BudgetError::NotPositive);
        }
        if let Some(&bad) = alert_at.iter().find(|&&p| p == 0 || p > 1000) {
            return Err(BudgetError::Threshold(bad));
        }
        let mut alert_at = alert_at.to_vec();
        alert_at.sort_unstable();
        alert_at.dedup();
        if alert_at.len() > MAX_THRESHOLDS {
            return Err(BudgetError::TooManyThresholds);
        }
        if low_balance_hours > MAX_LOW_BALANCE_HOURS {
            return Err(BudgetError::LowBalanceHours);
        }
        Ok(Budget {
            monthly,
            alert_at,
            stop_at_limit,
            low_balance_hours,
        })
    }

    /// The spend at which threshold `percent` is reached: `monthly × percent / 100`, rounded
    /// up, so that a threshold is never reached below its exact share.
    pub fn threshold_amount(&self, percent: u32) -> Money {
        let exact = i128::from(self.monthly.micros()) * i128::from(percent);
        let amount = (exact + 99).div_euclid(100);
        Money::from_micros(i64::try_from(amount).unwrap_or(i64::MAX))
    }

    /// The thresholds `spent` has reached, lowest first.
    pub fn reached(&self, spent: Money) -> Vec<u32> {
        self.alert_at
            .iter()
            .copied()
            .filter(|&p| spent >= self.threshold_amount(p))
            .collect()
    }

    /// Whether `spent` is at or past the budget: new reservations are refused.
    pub fn is_over(&self, spent: Money) -> bool {
        spent >= self.monthly
    }

    /// Whether `balance` covers less than `low_balance_hours` of spend at `burn_per_hour`.
    /// Nothing burning is never low.
    pub fn is_low(&self, balance: Money, burn_per_hour: Money) -> bool {
        if self.low_balance_hours == 0 || burn_per_hour.micros() <= 0 {
            return false;
        }
        let need = i128::from(burn_per_hour.micros()) * i128::from(self.low_balance_hours);
        i128::from(balance.micros()) < need
    }
}

/// The calendar month (UTC) of `at`: its first instant and the first of the next, with its
/// key (`2026-12`).
pub fn month_of(at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>, String) {
    let (y, m) = (at.year(), at.month());
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let first = |y: i32, m: u32| {
        NaiveDate::from_ymd_opt(y, m, 1)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map_or(at, |d| Utc.from_utc_datetime(&d))
    };
    (first(y, m), first(ny, nm), format!("{y:04}-{m:02}"))
}

/// What the month will have spent at its end if `burn_per_hour` goes on from `now`: `spent`
/// plus the burn for the seconds left, rounded up to the micro-unit.
pub fn forecast(spent: Money, burn_per_hour: Money, now: DateTime<Utc>) -> Money {
    let (_, end, _) = month_of(now);
    let left = (end - now).num_seconds().max(0);
    let more =
        (i128::from(burn_per_hour.micros().max(0)) * i128::from(left) + 3599).div_euclid(3600);
    let total = i128::from(spent.micros()) + more;
    Money::from_micros(i64::try_from(total).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests;
