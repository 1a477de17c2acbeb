//! What a reservation will cost on each tier: its rate, what is prepaid or held at the start,
//! and its standing against other spot bids. Offers, reservations and statements all come from
//! here, so they agree to the micro-unit.

use gpurent_types::{Money, Tier};

use crate::price_list::PriceList;
use crate::rate::Rate;

const SECONDS_PER_HOUR: u64 = 3600;
const MIB_PER_GB: u64 = 1024;

/// Whole GPUs, or a share of one, of a GPU model with `gpu_vram_mb` of memory each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    Whole { count: u32, gpu_vram_mb: u64 },
    Share { vram_mb: u64, gpu_vram_mb: u64 },
}

impl Size {
    /// GB of GPU memory the reservation holds: whole GPUs as `vram_gb` shows them, to the
    /// nearest GB (an H200's 143,771 MiB is 140, an RTX 4090's 24,564 MiB is 24), shares as
    /// asked, rounded up (what an explicit per-GB share price is charged on).
    pub fn gb(self) -> u64 {
        match self {
            Size::Whole { count, gpu_vram_mb } => u64::from(count)
                .saturating_mul(((gpu_vram_mb + MIB_PER_GB / 2) / MIB_PER_GB).max(1)),
            Size::Share { vram_mb, .. } => vram_mb.div_ceil(MIB_PER_GB),
        }
    }

    /// Whole-GPU equivalents in thousandths (a 12 GB share of a 24 GB GPU is 500).
    fn milli_gpus(self) -> u64 {
        match self {
            Size::Whole { count, .. } => u64::from(count) * 1000,
            Size::Share {
                vram_mb,
                gpu_vram_mb,
            } => (vram_mb.saturating_mul(1000) / gpu_vram_mb.max(1)).max(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuoteError {
    #[error("the bid {bid}/h is below the lowest spot price for this request, {min}/h")]
    BidTooLow { bid: Money, min: Money },
    #[error(
        "the bid {bid}/h is above the on-demand price {on_demand}/h; reserve on-demand instead"
    )]
    BidTooHigh { bid: Money, on_demand: Money },
    #[error("a bid is only for the spot tier")]
    BidNotSpot,
    #[error("reserved blocks are at least {min_hours} hours")]
    ReservedTooShort { min_hours: u32 },
    #[error("this deployment offers no reserved blocks")]
    NoReservedBlocks,
    #[error("the price does not fit in the ledger's range")]
    Overflow,
}

/// The price of one reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quote {
    pub tier: Tier,
    /// The hourly price at the start (what `price_per_hour` shows).
    pub price_per_hour: Money,
    pub rate: Rate,
    /// Paid into the tenant's hold at reservation: the first `prepaid_hours` (on-demand,
    /// stepped, spot) or the whole block (reserved).
    pub hold: Money,
    /// Percent off on-demand (reserved blocks).
    pub discount_percent: u32,
    /// Standing against other work for the same GPUs, in micro-units per GPU-hour: a spot
    /// bid's price per whole GPU; `i64::MAX` for work that is never preempted.
    pub priority: i64,
}

impl Quote {
    pub fn preemptible(&self) -> bool {
        self.tier == Tier::Spot
    }
}

fn mul_div_ceil(m: Money, num: u64, den: u64) -> Result<Money, QuoteError> {
    crate::price_list::mul_div_ceil(m, num, den).ok_or(QuoteError::Overflow)
}

impl PriceList {
    /// The on-demand hourly price of `size` of a GPU of this type: whole GPUs by model,
    /// shares by their fraction of the card (see [`PriceList::share_per_hour`]).
    pub fn on_demand_per_hour(
        &self,
        gpu_type: &gpurent_types::GpuType,
        size: Size,
    ) -> Result<Money, QuoteError> {
        match size {
            Size::Whole { count, gpu_vram_mb } => self
                .price_per_gpu_hour(gpu_type, gpu_vram_mb)
                .checked_mul(i64::from(count))
                .ok_or(QuoteError::Overflow),
            Size::Share {
                vram_mb,
                gpu_vram_mb,
            } => self.share_per_hour(gpu_type, vram_mb, gpu_vram_mb),
        }
    }

    /// A share of `vram_mb` of a card of `gpu_vram_mb`: its fraction of the card's on-demand
    /// price, rounded up to the micro-unit, plus the owner's premium, and never more than the
    /// whole card (a share of all of it costs the card). With an explicit `[shares]
    /// per_gb_hour`, that per GB instead (`incoherences` says where it passes the card).
    pub fn share_per_hour(
        &self,
        gpu_type: &gpurent_types::GpuType,
        vram_mb: u64,
        gpu_vram_mb: u64,
    ) -> Result<Money, QuoteError> {
        if let Some(per_gb) = self.share_per_gb_hour {
            let gb = Size::Share {
                vram_mb,
                gpu_vram_mb,
            }
            .gb();
            return per_gb
                .checked_mul(i64::try_from(gb).map_err(|_| QuoteError::Overflow)?)
                .ok_or(QuoteError::Overflow);
        }
        let card = self.price_per_gpu_hour(gpu_type, gpu_vram_mb);
        let part = mul_div_ceil(card, vram_mb, gpu_vram_mb)?;
        let priced = mul_div_ceil(part, 100 + u64::from(self.share_premium_percent), 100)?;
        Ok(priced.min(card))
    }

    /// The lowest spot bid for `size`: `min_bid_percent` of the on-demand price, rounded up.
    pub fn spot_min_bid(
        &self,
        gpu_type: &gpurent_types::GpuType,
        size: Size,
    ) -> Result<Money, QuoteError> {
        let on_demand = self.on_demand_per_hour(gpu_type, size)?;
        mul_div_ceil(on_demand, u64::from(self.spot_min_bid_percent), 100)
    }

    /// The stepped tier's rate for `size`: its percents of the on-demand price of `size`.
    pub fn stepped_rate(
        &self,
        gpu_type: &gpurent_types::GpuType,
        size: Size,
    ) -> Result<Rate, QuoteError> {
        let on_demand = self.on_demand_per_hour(gpu_type, size)?;
        Ok(Rate {
            first: mul_div_ceil(on_demand, u64::from(self.stepped.first_percent), 100)?,
            step_s: u64::from(self.stepped.first_hours) * SECONDS_PER_HOUR,
            then: mul_div_ceil(on_demand, u64::from(self.stepped.then_percent), 100)?,
        })
    }

    /// The discount on a reserved block of `hours`: the largest whose minimum it reaches.
    pub fn reserved_discount(&self, duration_s: u64) -> Result<u32, QuoteError> {
        let Some(&(min_hours, _)) = self.reserved_discounts.first() else {
            return Err(QuoteError::NoReservedBlocks);
        };
        self.reserved_discounts
            .iter()
            .rev()
            .find(|(h, _)| duration_s >= u64::from(*h) * SECONDS_PER_HOUR)
            .map(|&(_, p)| p)
            .ok_or(QuoteError::ReservedTooShort { min_hours })
    }

    /// The reserved-block discounts: (minimum hours, percent off).
    pub fn reserved_discounts(&self) -> &[(u32, u32)] {
        &self.reserved_discounts
    }

    /// The hourly price of `size` in a reserved block of each length: (minimum hours, percent
    /// off, price per hour), as `quote` charges it.
    pub fn reserved_prices(
        &self,
        gpu_type: &gpurent_types::GpuType,
        size: Size,
    ) -> Result<Vec<(u32, u32, Money)>, QuoteError> {
        let on_demand = self.on_demand_per_hour(gpu_type, size)?;
        self.reserved_discounts
            .iter()
            .map(|&(hours, percent)| {
                Ok((
                    hours,
                    percent,
                    mul_div_ceil(on_demand, u64::from(100 - percent), 100)?,
                ))
            })
            .collect()
    }

    /// The price of a reservation of `size` for `duration_s` seconds on `tier`.
    pub fn quote(
        &self,
        gpu_type: &gpurent_types::GpuType,
        size: Size,
        duration_s: u64,
        tier: Tier,
        bid: Option<Money>,
    ) -> Result<Quote, QuoteError> {
        if bid.is_some() && tier != Tier::Spot {
            return Err(QuoteError::BidNotSpot);
        }
        let on_demand = self.on_demand_per_hour(gpu_type, size)?;
        let mut discount_percent = 0;
        let mut priority = i64::MAX;
        let rate = match tier {
            Tier::OnDemand => Rate::flat(on_demand),
            Tier::Stepped => self.stepped_rate(gpu_type, size)?,
            Tier::Reserved => {
                discount_percent = self.reserved_discount(duration_s)?;
                Rate::flat(mul_div_ceil(
                    on_demand,
                    u64::from(100 - discount_percent),
                    100,
                )?)
            }
            Tier::Spot => {
                let min = self.spot_min_bid(gpu_type, size)?;
                let bid = bid.unwrap_or(min);
                if bid < min {
                    return Err(QuoteError::BidTooLow { bid, min });
                }
                if bid > on_demand {
                    return Err(QuoteError::BidTooHigh { bid, on_demand });
                }
                // Per whole GPU, so that bids for different sizes compare.
                priority = mul_div_ceil(bid, 1000, size.milli_gpus())?.micros();
                Rate::flat(bid)
            }
        };
        // The settlement computes seconds × price (and a charge × the host share in basis
        // points) in 64-bit integers: both must fit for the whole duration.
        let most = i128::from(rate.first.micros().max(rate.then.micros()));
        if most * i128::from(duration_s) * 3 >= i128::from(i64::MAX) {
            return Err(QuoteError::Overflow);
        }
        // A reserved block is prepaid in full; other tiers hold their first hours.
        let held_s = if tier == Tier::Reserved {
            duration_s
        } else {
            duration_s.min(u64::from(self.prepaid_hours) * SECONDS_PER_HOUR)
        };
        Ok(Quote {
            tier,
            price_per_hour: rate.first,
            rate,
            hold: rate.charge_for_seconds(held_s),
            discount_percent,
            priority,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpurent_types::GpuType;

    fn a100() -> GpuType {
        GpuType::parse("A100-80GB").unwrap_or_else(|e| panic!("{e}"))
    }

    const A100_MB: u64 = 80 * 1024;
    const FOUR: Size = Size::Whole {
        count: 4,
        gpu_vram_mb: A100_MB,
    };
    const HOURS_72: u64 = 72 * 3600;

    fn total(tier: Tier, size: Size, bid: Option<Money>) -> (Quote, Money) {
        let q = PriceList::defaults()
            .quote(&a100(), size, HOURS_72, tier, bid)
            .unwrap_or_else(|e| panic!("{tier}: {e}"));
        (q, q.rate.charge_for_seconds(HOURS_72))
    }

    /// The seeds' example job, 72 hours on four A100s, on every tier with the default plans.
    #[test]
    fn golden_72h_on_four_a100s() {
        let (q, cost) = total(Tier::OnDemand, FOUR, None);
        assert_eq!(
            (q.price_per_hour.to_string(), cost.to_string()),
            ("16.00".into(), "1152.00".into())
        );
        assert_eq!(q.hold.to_string(), "16.00");

        // The on-demand price for 3 hours, then 60% of it for 69.
        let (q, cost) = total(Tier::Stepped, FOUR, None);
        assert_eq!(q.price_per_hour.to_string(), "16.00");
        assert_eq!(q.rate.then.to_string(), "9.60");
        assert_eq!(cost.to_string(), "710.40");

        // 72 h is a 24 h+ block: 20% off, prepaid in full.
        let (q, cost) = total(Tier::Reserved, FOUR, None);
        assert_eq!(
            (q.discount_percent, q.price_per_hour.to_string()),
            (20, "12.80".into())
        );
        assert_eq!(cost.to_string(), "921.60");
        assert_eq!(q.hold, cost);

        // Spot at the lowest bid (40% of on-demand), and at a bid of 8.00.
        let (q, cost) = total(Tier::Spot, FOUR, None);
        assert_eq!(
            (q.price_per_hour.to_string(), cost.to_string()),
            ("6.40".into(), "460.80".into())
        );
        assert_eq!(q.priority, 1_600_000);
        let (q, cost) = total(Tier::Spot, FOUR, Some(Money::units(8)));
        assert_eq!(
            (q.price_per_hour.to_string(), cost.to_string()),
            ("8.00".into(), "576.00".into())
        );

        // A share of 40 GB, half an A100-80GB, for 72 h: half the card's price.
        let share = Size::Share {
            vram_mb: 40 * 1024,
            gpu_vram_mb: A100_MB,
        };
        let (q, cost) = total(Tier::OnDemand, share, None);
        assert_eq!(
            (q.price_per_hour.to_string(), cost.to_string()),
            ("2.00".into(), "144.00".into())
        );
    }

    #[test]
    fn bad_bids_and_blocks_are_refused() {
        let list = PriceList::defaults();
        let q = |tier, hours: u64, bid| list.quote(&a100(), FOUR, hours * 3600, tier, bid);
        assert_eq!(
            q(Tier::Spot, 1, Some(Money::units(1))),
            Err(QuoteError::BidTooLow {
                bid: Money::units(1),
                min: Money::from_micros(6_400_000)
            })
        );
        assert!(matches!(
            q(Tier::Spot, 1, Some(Money::units(17))),
            Err(QuoteError::BidTooHigh { .. })
        ));
        assert_eq!(
            q(Tier::OnDemand, 1, Some(Money::units(9))),
            Err(QuoteError::BidNotSpot)
        );
        assert_eq!(
            q(Tier::Reserved, 23, None),
            Err(QuoteError::ReservedTooShort { min_hours: 24 })
        );
        assert_eq!(
            q(Tier::Reserved, 24 * 7, None).map(|q| q.discount_percent),
            Ok(30)
        );
        assert_eq!(
            q(Tier::Reserved, 24 * 365, None).map(|q| q.discount_percent),
            Ok(40)
        );
    }

    #[test]
    fn spot_priority_is_per_whole_gpu() {
        let list = PriceList::defaults();
        let one = Size::Whole {
            count: 1,
            gpu_vram_mb: A100_MB,
        };
        let half = Size::Share {
            vram_mb: 40 * 1024,
            gpu_vram_mb: A100_MB,
        };
        let p = |size, bid| {
            list.quote(&a100(), size, 3600, Tier::Spot, Some(bid))
                .map(|q| q.priority)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(p(one, Money::units(3)), 3_000_000);
        assert_eq!(p(FOUR, Money::units(12)), 3_000_000);
        // Half a GPU bid at 1.50 is 3.00 a GPU.
        assert_eq!(p(half, Money::from_micros(1_500_000)), 3_000_000);
    }
}
