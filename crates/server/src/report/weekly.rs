//! The weekly report: per price tier, the GPU-hours, what was charged and per GPU-hour, the
//! preemptions, and how the money split between hosts and the platform.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use gpurent_store::UsageFacts;
use gpurent_types::report::{TierUsage, WeeklyReport};
use gpurent_types::{Money, Tier};

use super::window::{clip, Week};
use super::{gpu_hours, MILLI};

const TIERS: [Tier; 4] = [Tier::OnDemand, Tier::Stepped, Tier::Spot, Tier::Reserved];

#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    reservations: u32,
    milli_s: i64,
    charged: i64,
    host_earnings: i64,
    preemptions: u32,
}

impl Sums {
    fn add(&mut self, o: Sums) {
        self.reservations += o.reservations;
        self.milli_s += o.milli_s;
        self.charged += o.charged;
        self.host_earnings += o.host_earnings;
        self.preemptions += o.preemptions;
    }

    fn usage(self, tier: Option<Tier>) -> TierUsage {
        // Rounded down to the micro-unit, like every charge.
        let per_hour = (self.milli_s > 0).then(|| {
            let micros =
                i128::from(self.charged) * i128::from(MILLI * 3600) / i128::from(self.milli_s);
            Money::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
        });
        TierUsage {
            tier,
            reservations: self.reservations,
            gpu_hours: gpu_hours(self.milli_s),
            charged: Money::from_micros(self.charged),
            price_per_gpu_hour: per_hour,
            preemptions: self.preemptions,
            host_earnings: Money::from_micros(self.host_earnings),
            platform_return: Money::from_micros(self.charged - self.host_earnings),
        }
    }
}

/// The report of [from, to); work still running counts up to `now`.
pub(crate) fn weekly(facts: &UsageFacts, week: Week, now: DateTime<Utc>) -> WeeklyReport {
    let Week { name, from, to } = week;
    let (f, t) = (from.timestamp(), to.timestamp());
    let vram: HashMap<&str, i64> = facts
        .gpus
        .iter()
        .map(|g| (g.uuid.as_str(), g.vram_mb))
        .collect();
    let mut by_tier: HashMap<Tier, Sums> = HashMap::new();
    for r in &facts.reservations {
        let end = r.ended_at.unwrap_or(now).timestamp();
        let seconds = r
            .started_at
            .and_then(|s| clip(s.timestamp(), end, f, t))
            .map_or(0, |(s, e)| e - s);
        let milli: i64 = r
            .gpus
            .iter()
            .filter_map(|u| vram.get(u.as_str()))
            .map(|&v| r.share_mb.map_or(MILLI, |mb| MILLI * mb.min(v) / v.max(1)))
            .sum();
        let preempted = r.end_reason.as_deref() == Some("preempted")
            && r.ended_at.is_some_and(|e| (f..t).contains(&e.timestamp()));
        by_tier.entry(r.tier).or_default().add(Sums {
            reservations: 1,
            milli_s: milli * seconds,
            charged: r.charged.micros(),
            // The share of its charges in the week, rounded down as the ledger rounds it.
            host_earnings: i64::try_from(
                i128::from(r.charged.micros()) * i128::from(r.host_share_bps) / 10_000,
            )
            .unwrap_or(i64::MAX),
            preemptions: u32::from(preempted),
        });
    }
    let mut total = Sums::default();
    let tiers = TIERS
        .iter()
        .map(|&tier| {
            let s = by_tier.get(&tier).copied().unwrap_or_default();
            total.add(s);
            s.usage(Some(tier))
        })
        .collect();
    WeeklyReport {
        week: name,
        from,
        to,
        tiers,
        total: total.usage(None),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{at, facts};
    use super::*;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    #[test]
    fn the_tiers_match_the_hand_computation() {
        let week = Week {
            name: None,
            from: at(0, 0),
            to: at(24 * 7, 0),
        };
        let r = weekly(&facts(), week, at(24, 0));
        let tier = |t: Tier| r.tiers.iter().find(|u| u.tier == Some(t)).unwrap();
        let od = tier(Tier::OnDemand);
        // 2 GPUs x 1.5 h; 7.500001 / 3 GPU-h rounded down.
        assert_eq!((od.gpu_hours, od.charged), (3.0, m("7.500001")));
        assert_eq!(od.price_per_gpu_hour, Some(m("2.50")));
        assert_eq!(
            (od.host_earnings, od.platform_return),
            (m("6.00"), m("1.500001"))
        );
        let spot = tier(Tier::Spot);
        // Only its hour in the window counts: a quarter GPU for 1 h, 1.00 charged.
        assert_eq!((spot.gpu_hours, spot.preemptions), (0.25, 1));
        assert_eq!(spot.price_per_gpu_hour, Some(m("4.00")));
        let reserved = tier(Tier::Reserved);
        assert_eq!(
            (reserved.gpu_hours, reserved.price_per_gpu_hour),
            (0.5, Some(m("2.50")))
        );
        let stepped = tier(Tier::Stepped);
        assert_eq!(
            (stepped.reservations, stepped.price_per_gpu_hour),
            (0, None)
        );
        assert_eq!(r.total.gpu_hours, 3.75);
        assert_eq!(r.total.charged, m("9.750001"));
        assert_eq!((r.total.reservations, r.total.preemptions), (3, 1));
    }
}
