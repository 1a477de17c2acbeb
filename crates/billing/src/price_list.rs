//! The price plans of a deployment: the on-demand price of one whole GPU per hour by model,
//! everything else relative to it; defaults, and the owner's price file over them.

use std::collections::BTreeMap;

use gpurent_types::{GpuType, Money};

mod file;

pub use file::PriceListError;

/// The price plans of a deployment: on-demand per whole GPU-hour by model (unlisted models per
/// GB of memory), and the other tiers relative to on-demand: shares by their fraction of the
/// card, the duration-stepped tier and reserved blocks in percent, the spot floor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceList {
    per_gpu_hour: BTreeMap<String, Money>,
    /// Unlisted models: this per GB of their memory (explicit, or derived from the listed ones).
    per_gb_hour_fallback: Money,
    per_gb_hour_explicit: bool,
    /// Percent added to a share's fraction of its card's price (never past the whole card).
    pub(crate) share_premium_percent: u32,
    /// `[shares] per_gb_hour`: the owner's explicit per-GB price of shares, not derived from
    /// the card (kept from before; `incoherences` names the cards it makes a share dearer than).
    pub(crate) share_per_gb_hour: Option<Money>,
    pub(crate) stepped: Stepped,
    /// (minimum hours, percent off), by minimum hours.
    pub(crate) reserved_discounts: Vec<(u32, u32)>,
    pub(crate) spot_min_bid_percent: u32,
    pub(crate) prepaid_hours: u32,
    currency: String,
    /// Seconds a preempted spot instance gets between SIGTERM and SIGKILL.
    pub spot_grace_s: u64,
    /// The part of every charge paid to the owner of the node, in basis points.
    pub host_share_bps: u32,
    /// A volume's price per GB (10^9 bytes) of its size per month (730 hours).
    pub storage_per_gb_month: Money,
}

/// The duration-stepped ("high-performance") tier, in percent of the on-demand price of the
/// same size: `first_percent` for the first `first_hours`, `then_percent` after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stepped {
    pub first_hours: u32,
    pub first_percent: u32,
    pub then_percent: u32,
}

/// The currency of the defaults, and of a price file that names none.
pub const DEFAULT_CURRENCY: &str = "USD";

/// Default on-demand prices per whole GPU-hour, in USD, with each model's memory in GB as its
/// driver reports it (to the nearest GB: an H200's 143,771 MiB is 140). The RTX 4090 price is
/// the seeds' (2.50 per hour). The memory derives the per-GB price of unlisted models.
const DEFAULTS: [(&str, i64, u32); 12] = [
    ("RTX 3090", 1_200_000, 24),
    ("RTX 4090", 2_500_000, 24),
    ("RTX 5090", 3_500_000, 32),
    ("L4", 1_000_000, 24),
    ("L40S", 3_000_000, 48),
    ("A10", 1_100_000, 24),
    ("A100-40GB", 3_000_000, 40),
    ("A100-80GB", 4_000_000, 80),
    ("H100-80GB", 7_000_000, 80),
    ("H100", 7_000_000, 80),
    ("H200", 9_000_000, 140),
    ("B200", 12_000_000, 179),
];

/// The display names and memory of the models gpurent knows.
pub(crate) fn known_models() -> impl Iterator<Item = (GpuType, u32)> {
    DEFAULTS
        .iter()
        .filter_map(|(name, _, gb)| GpuType::parse(name).ok().map(|t| (t, *gb)))
}

/// `micros × num / den`, rounded up to the micro-unit.
pub(crate) fn mul_div_ceil(m: Money, num: u64, den: u64) -> Option<Money> {
    let den = i128::from(den.max(1));
    let v = (i128::from(m.micros()) * i128::from(num) + den - 1) / den;
    i64::try_from(v).ok().map(Money::from_micros)
}

impl PriceList {
    pub fn defaults() -> Self {
        let per_gpu_hour = DEFAULTS
            .iter()
            .filter_map(|(name, micros, _)| {
                GpuType::parse(name)
                    .ok()
                    .map(|t| (t.key().to_owned(), Money::from_micros(*micros)))
            })
            .collect();
        let mut list = PriceList {
            per_gpu_hour,
            per_gb_hour_fallback: Money::ZERO,
            per_gb_hour_explicit: false,
            // The seeds sell a share per GB at a quarter of their stepped tier's first price;
            // here it is simply its part of the card, which is what renting the card costs.
            share_premium_percent: 0,
            share_per_gb_hour: None,
            // The seeds' stepped tier, 2.0 per GB for the first 3 hours stepping down to 1.2,
            // as a shape on on-demand: 100%, then 60%. Spot at 40% of on-demand or more
            // (Vast.ai's interruptible instances); reserved discounts of 20/30/40% as Vast.ai
            // and RunPod.
            stepped: Stepped {
                first_hours: 3,
                first_percent: 100,
                then_percent: 60,
            },
            reserved_discounts: vec![(24, 20), (24 * 7, 30), (24 * 30, 40)],
            spot_min_bid_percent: 40,
            prepaid_hours: 1,
            currency: DEFAULT_CURRENCY.to_owned(),
            spot_grace_s: 30,
            // Vast.ai and RunPod pass hosts about three quarters to four fifths of the price.
            host_share_bps: 8_000,
            // RunPod's network volumes: 0.07 per GB-month.
            storage_per_gb_month: Money::from_micros(70_000),
        };
        list.per_gb_hour_fallback = list
            .derived_per_gb_hour()
            .unwrap_or(Money::from_micros(100_000));
        list
    }

    /// The per-GB price of unlisted models, coherent with the listed ones: the median of the
    /// listed models' prices per GB of memory (the mean of the middle two, rounded up), over the
    /// models gpurent knows the memory of. `None` when none of them is listed.
    fn derived_per_gb_hour(&self) -> Option<Money> {
        let mut per_gb: Vec<i64> = known_models()
            .filter_map(|(t, gb)| {
                let p = self.per_gpu_hour.get(t.key())?;
                mul_div_ceil(*p, 1, u64::from(gb)).map(Money::micros)
            })
            .collect();
        per_gb.sort_unstable();
        let n = per_gb.len();
        if n == 0 {
            return None;
        }
        let (lo, hi) = (per_gb[(n - 1) / 2], per_gb[n / 2]);
        Some(Money::from_micros(lo + (hi - lo + 1) / 2))
    }

    pub fn with_price(mut self, gpu_type: &GpuType, per_hour: Money) -> Self {
        self.per_gpu_hour
            .insert(gpu_type.key().to_owned(), per_hour);
        self
    }

    /// The platform's currency (ISO 4217): every amount is in it.
    pub fn currency(&self) -> &str {
        &self.currency
    }

    /// The per-GB price of models that are not listed.
    pub fn per_gb_hour_fallback(&self) -> Money {
        self.per_gb_hour_fallback
    }

    /// Whether the model has a price of its own (not derived from its memory).
    pub(crate) fn is_listed(&self, gpu_type: &GpuType) -> bool {
        self.per_gpu_hour.contains_key(gpu_type.key())
    }

    /// On-demand price of one whole GPU of this type for one hour.
    pub fn price_per_gpu_hour(&self, gpu_type: &GpuType, vram_mb: u64) -> Money {
        if let Some(p) = self.per_gpu_hour.get(gpu_type.key()) {
            return *p;
        }
        // An unlisted MIG slice: its part of its parent model's listed price (`crate::mig`).
        if let Some(p) = crate::mig::listed_parent_share(gpu_type, |parent| {
            self.per_gpu_hour.get(parent.key()).copied()
        }) {
            return p;
        }
        // Other unlisted models: by memory, to the nearest GB as offers show it.
        let gb = i64::try_from(((vram_mb + 512) / 1024).max(1)).unwrap_or(i64::MAX);
        self.per_gb_hour_fallback
            .checked_mul(gb)
            .unwrap_or(Money::from_micros(i64::MAX))
    }
}

#[cfg(test)]
mod tests;
