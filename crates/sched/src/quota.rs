//! GPU quotas with borrowing (the Kueue cohort model): work within a team's quota of a GPU
//! type is guaranteed and may take back what others borrowed; above it a team borrows idle
//! GPUs up to its borrow limit, and borrowed work is the first to be preempted. Amounts are in
//! milli-GPUs, so that a share counts as its fraction.

use crate::Request;

/// One whole GPU, in milli-GPUs.
pub const WHOLE: u64 = 1000;

/// The base priority borrowed work is seen at by a guaranteed request: below any spot bid,
/// so that it is the first victim.
pub const BORROWED: i64 = -1;

/// A team's quota of one GPU type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Guaranteed, in milli-GPUs.
    pub guaranteed: u64,
    /// The most it may use beyond `guaranteed` while others do not need it; `None`: as much
    /// as is idle.
    pub borrow_limit: Option<u64>,
}

/// Where a new piece of work stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The type has no quotas: as before quotas existed.
    Unmanaged,
    /// Within the team's quota: it may preempt others' borrowed work.
    Guaranteed,
    /// Beyond it (or a team without a quota of a type that has quotas): it runs on idle GPUs
    /// and is the first to be preempted when a quota's owner asks for them back.
    Borrowed,
}

/// Why work may not start even on idle GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "over quota: the team's quota of this type is {} GPUs and it may borrow {} more; it uses \
     {} and this asks {}",
    milli(quota.guaranteed),
    milli(quota.borrow_limit.unwrap_or(0)),
    milli(*used),
    milli(*asked)
)]
pub struct OverQuota {
    pub quota: Quota,
    pub used: u64,
    pub asked: u64,
}

/// Milli-GPUs as a decimal number of GPUs (`1.5`).
pub fn milli(m: u64) -> String {
    let (whole, frac) = (m / WHOLE, m % WHOLE);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{}", format!("{frac:03}").trim_end_matches('0'))
    }
}

/// What a request takes of a type whose cards have `card_vram_mb`: whole GPUs whole, a share
/// its fraction of a card, rounded up (never less than 1).
pub fn asked(request: Request, card_vram_mb: u64) -> u64 {
    match request {
        Request::Whole { count } => u64::from(count) * WHOLE,
        Request::Share { vram_mb } => {
            let card = card_vram_mb.max(1);
            (vram_mb.saturating_mul(WHOLE).div_ceil(card)).clamp(1, WHOLE)
        }
    }
}

/// Where work asking `asked` stands for a team that uses `used` of the type, with `quota`
/// (none: the team has no quota of it) when the type has quotas at all (`managed`).
pub fn standing(
    managed: bool,
    quota: Option<Quota>,
    used: u64,
    asked: u64,
) -> Result<Standing, OverQuota> {
    if !managed {
        return Ok(Standing::Unmanaged);
    }
    let Some(quota) = quota else {
        return Ok(Standing::Borrowed);
    };
    let after = used.saturating_add(asked);
    if after <= quota.guaranteed {
        return Ok(Standing::Guaranteed);
    }
    match quota.borrow_limit {
        Some(limit) if after > quota.guaranteed.saturating_add(limit) => {
            Err(OverQuota { quota, used, asked })
        }
        _ => Ok(Standing::Borrowed),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn amounts_read_as_gpus() {
        assert_eq!(milli(16_000), "16");
        assert_eq!(milli(1_500), "1.5");
        assert_eq!(milli(250), "0.25");
        assert_eq!(asked(Request::Whole { count: 2 }, 24_576), 2_000);
        assert_eq!(asked(Request::Share { vram_mb: 12_288 }, 24_576), 500);
        assert_eq!(asked(Request::Share { vram_mb: 1 }, 24_576), 1);
    }

    #[test]
    fn within_above_and_past_the_limit() {
        let q = Quota {
            guaranteed: 2_000,
            borrow_limit: Some(1_000),
        };
        assert_eq!(
            standing(false, Some(q), 9_000, 1_000),
            Ok(Standing::Unmanaged)
        );
        assert_eq!(standing(true, None, 9_000, 1_000), Ok(Standing::Borrowed));
        assert_eq!(
            standing(true, Some(q), 1_000, 1_000),
            Ok(Standing::Guaranteed)
        );
        assert_eq!(
            standing(true, Some(q), 2_000, 1_000),
            Ok(Standing::Borrowed)
        );
        let over = standing(true, Some(q), 2_500, 1_000).unwrap_err();
        assert_eq!(
            over.to_string(),
            "over quota: the team's quota of this type is 2 GPUs and it may borrow 1 more; it \
             uses 2.5 and this asks 1"
        );
        // A quota set below what already runs: nothing guaranteed until it is back under.
        assert_eq!(
            standing(true, Some(q), 5_000, 500).map_err(|e| e.used),
            Err(5_000)
        );
    }

    proptest! {
        /// Guaranteed exactly when the total fits the quota; refused exactly when it passes
        /// the quota and a limit; and a smaller ask never stands worse than a larger one.
        #[test]
        fn standing_follows_the_totals(
            guaranteed in 0u64..20_000,
            limit in proptest::option::of(0u64..20_000),
            used in 0u64..40_000,
            a in 1u64..8_000,
            b in 1u64..8_000,
        ) {
            let q = Quota { guaranteed, borrow_limit: limit };
            let s = standing(true, Some(q), used, a);
            prop_assert_eq!(s == Ok(Standing::Guaranteed), used + a <= guaranteed);
            let past = limit.is_some_and(|l| used + a > guaranteed + l);
            prop_assert_eq!(s.is_err(), past);
            let rank = |s: &Result<Standing, OverQuota>| match s {
                Ok(Standing::Guaranteed) => 0,
                Ok(_) => 1,
                Err(_) => 2,
            };
            let (small, large) = (a.min(b), a.max(b));
            prop_assert!(rank(&standing(true, Some(q), used, small)) <= rank(&standing(true, Some(q), used, large)));
        }
    }
}
