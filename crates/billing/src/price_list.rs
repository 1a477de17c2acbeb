//! The on-demand price of one whole GPU per hour, by model, with defaults from the seeds.

use std::collections::BTreeMap;

use gpurent_types::{GpuType, Money};

/// The price plans of a deployment: on-demand per whole GPU-hour by model, shares per GB of
/// memory, the duration-stepped tier, reserved-block discounts and the spot floor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceList {
    per_gpu_hour: BTreeMap<String, Money>,
    per_gb_hour_fallback: Money,
    pub(crate) share_per_gb_hour: Money,
    pub(crate) stepped: Stepped,
    /// (minimum hours, percent off), by minimum hours.
    pub(crate) reserved_discounts: Vec<(u32, u32)>,
    pub(crate) spot_min_bid_percent: u32,
    pub(crate) prepaid_hours: u32,
    /// Seconds a preempted spot instance gets between SIGTERM and SIGKILL.
    pub spot_grace_s: u64,
    /// The part of every charge paid to the owner of the node, in basis points.
    pub host_share_bps: u32,
}

/// The duration-stepped ("high-performance") tier: per GB of GPU memory per hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stepped {
    pub first_hours: u32,
    pub first_per_gb_hour: Money,
    pub then_per_gb_hour: Money,
}

/// Defaults in the platform currency. The RTX 4090 price is the seeds' (2.50 per hour).
const DEFAULTS: [(&str, i64); 12] = [
    ("RTX 3090", 1_200_000),
    ("RTX 4090", 2_500_000),
    ("RTX 5090", 3_500_000),
    ("L4", 1_000_000),
    ("L40S", 3_000_000),
    ("A10", 1_100_000),
    ("A100-40GB", 3_000_000),
    ("A100-80GB", 4_000_000),
    ("H100-80GB", 7_000_000),
    ("H100", 7_000_000),
    ("H200", 9_000_000),
    ("B200", 12_000_000),
];

/// A price file, as an owner writes it (every key is optional; what it does not name keeps
/// its default):
///
/// ```toml
/// # Models not listed under [gpu] cost this much per GB of memory per hour.
/// per_gb_hour = "0.08"
/// # A reservation needs credit for this many hours of it (or all of a shorter one).
/// prepaid_hours = 1
/// # The part of every charge paid to the node's owner.
/// host_share_percent = 80
///
/// # On-demand: one whole GPU for one hour, by model (names as `gpurent offers` shows them).
/// [gpu]
/// "RTX 4090" = "2.20"
/// "H100-80GB" = "6.50"
///
/// # Shares of a GPU (`--vram-gb`): per GB of memory per hour.
/// [shares]
/// per_gb_hour = "0.50"
///
/// # The duration-stepped tier (`--tier stepped`): per GB of memory per hour.
/// [stepped]
/// first_hours = 3
/// first_per_gb_hour = "2.00"
/// then_per_gb_hour = "1.20"
///
/// # Reserved blocks (`--tier reserved`), prepaid: percent off on-demand by length.
/// [reserved]
/// discounts = [{ min_hours = 24, percent = 20 }, { min_hours = 168, percent = 30 }]
///
/// # Spot (`--tier spot --bid PRICE`): the lowest bid, in percent of the on-demand price,
/// # and the notice a preempted instance gets (SIGTERM, then SIGKILL this much later).
/// [spot]
/// min_bid_percent = 40
/// grace_seconds = 30
/// ```
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    #[serde(default)]
    gpu: BTreeMap<String, String>,
    per_gb_hour: Option<String>,
    prepaid_hours: Option<u32>,
    host_share_percent: Option<u32>,
    shares: Option<SharesFile>,
    stepped: Option<SteppedFile>,
    reserved: Option<ReservedFile>,
    spot: Option<SpotFile>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SharesFile {
    per_gb_hour: String,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SteppedFile {
    first_hours: Option<u32>,
    first_per_gb_hour: Option<String>,
    then_per_gb_hour: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReservedFile {
    discounts: Vec<DiscountFile>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DiscountFile {
    min_hours: u32,
    percent: u32,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SpotFile {
    min_bid_percent: Option<u32>,
    grace_seconds: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PriceListError {
    #[error("the price file is not valid TOML: {0}")]
    Toml(#[source] toml::de::Error),
    #[error("price of {what} is {value:?}: {reason}")]
    Price {
        what: String,
        value: String,
        reason: String,
    },
    #[error("{what}: {reason}")]
    Setting { what: String, reason: String },
}

fn setting(what: &str, reason: &str) -> PriceListError {
    PriceListError::Setting {
        what: what.to_owned(),
        reason: reason.to_owned(),
    }
}

fn price(what: &str, value: &str) -> Result<Money, PriceListError> {
    let fail = |reason: String| PriceListError::Price {
        what: what.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let money: Money = value
        .parse()
        .map_err(|e: gpurent_types::MoneyError| fail(e.to_string()))?;
    if money <= Money::ZERO || money > Money::units(1_000_000) {
        return Err(fail(
            "a price must be more than 0 and at most 1000000".to_owned(),
        ));
    }
    Ok(money)
}

impl PriceList {
    /// The defaults, overridden by a price file (see [`PriceFile`] for its format).
    pub fn from_toml(text: &str) -> Result<Self, PriceListError> {
        let file: PriceFile = toml::from_str(text).map_err(PriceListError::Toml)?;
        let mut list = PriceList::defaults();
        for (model, value) in &file.gpu {
            let gpu_type = GpuType::parse(model).map_err(|e| PriceListError::Price {
                what: model.clone(),
                value: value.clone(),
                reason: e.to_string(),
            })?;
            list = list.with_price(&gpu_type, price(model, value)?);
        }
        if let Some(value) = &file.per_gb_hour {
            list.per_gb_hour_fallback = price("per_gb_hour", value)?;
        }
        if let Some(hours) = file.prepaid_hours {
            if hours > 24 * 31 {
                return Err(setting("prepaid_hours", "must be at most 744 (a month)"));
            }
            list.prepaid_hours = hours;
        }
        if let Some(shares) = &file.shares {
            list.share_per_gb_hour = price("shares.per_gb_hour", &shares.per_gb_hour)?;
        }
        if let Some(stepped) = &file.stepped {
            if let Some(hours) = stepped.first_hours {
                if hours == 0 || hours > 24 * 366 {
                    return Err(setting(
                        "stepped.first_hours",
                        "must be from 1 to 8784 (a year)",
                    ));
                }
                list.stepped.first_hours = hours;
            }
            if let Some(v) = &stepped.first_per_gb_hour {
                list.stepped.first_per_gb_hour = price("stepped.first_per_gb_hour", v)?;
            }
            if let Some(v) = &stepped.then_per_gb_hour {
                list.stepped.then_per_gb_hour = price("stepped.then_per_gb_hour", v)?;
            }
        }
        if let Some(reserved) = &file.reserved {
            let mut discounts: Vec<(u32, u32)> = reserved
                .discounts
                .iter()
                .map(|d| (d.min_hours, d.percent))
                .collect();
            discounts.sort_unstable();
            if discounts.iter().any(|&(h, p)| h == 0 || p >= 100) {
                return Err(setting(
                    "reserved.discounts",
                    "min_hours must be at least 1 and percent below 100",
                ));
            }
            if discounts.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err(setting(
                    "reserved.discounts",
                    "two discounts for the same min_hours",
                ));
            }
            list.reserved_discounts = discounts;
        }
        if let Some(spot) = &file.spot {
            if let Some(percent) = spot.min_bid_percent {
                if percent == 0 || percent > 100 {
                    return Err(setting("spot.min_bid_percent", "must be from 1 to 100"));
                }
                list.spot_min_bid_percent = percent;
            }
            if let Some(grace) = spot.grace_seconds {
                if grace > 3600 {
                    return Err(setting("spot.grace_seconds", "must be at most 3600"));
                }
                list.spot_grace_s = grace;
            }
        }
        if let Some(percent) = file.host_share_percent {
            if percent > 100 {
                return Err(setting("host_share_percent", "must be from 0 to 100"));
            }
            list.host_share_bps = percent * 100;
        }
        Ok(list)
    }

    pub fn defaults() -> Self {
        let per_gpu_hour = DEFAULTS
            .iter()
            .filter_map(|(name, micros)| {
                GpuType::parse(name)
                    .ok()
                    .map(|t| (t.key().to_owned(), Money::from_micros(*micros)))
            })
            .collect();
        PriceList {
            per_gpu_hour,
            per_gb_hour_fallback: Money::from_micros(100_000),
            // The seeds' three tiers: 0.5 per GB per hour for shares, 2.0 per GB per hour for
            // the first 3 hours stepping down to 1.2, spot at half price or less (Vast.ai's
            // interruptible instances); reserved discounts of 20/30/40% as Vast.ai and RunPod.
            share_per_gb_hour: Money::from_micros(500_000),
            stepped: Stepped {
                first_hours: 3,
                first_per_gb_hour: Money::units(2),
                then_per_gb_hour: Money::from_micros(1_200_000),
            },
            reserved_discounts: vec![(24, 20), (24 * 7, 30), (24 * 30, 40)],
            spot_min_bid_percent: 40,
            prepaid_hours: 1,
            spot_grace_s: 30,
            // Vast.ai and RunPod pass hosts about three quarters to four fifths of the price.
            host_share_bps: 8_000,
        }
    }

    pub fn with_price(mut self, gpu_type: &GpuType, per_hour: Money) -> Self {
        self.per_gpu_hour
            .insert(gpu_type.key().to_owned(), per_hour);
        self
    }

    /// On-demand price of one whole GPU of this type for one hour.
    pub fn price_per_gpu_hour(&self, gpu_type: &GpuType, vram_mb: u64) -> Money {
        if let Some(p) = self.per_gpu_hour.get(gpu_type.key()) {
            return *p;
        }
        // An unlisted MIG instance: its part of its parent's listed price (`crate::mig`).
        if let Some(p) = crate::mig::listed_parent_share(gpu_type, |parent| {
            self.per_gpu_hour.get(parent.key()).copied()
        }) {
            return p;
        }
        let gb = i64::try_from(vram_mb.div_ceil(1024)).unwrap_or(i64::MAX);
        self.per_gb_hour_fallback
            .checked_mul(gb)
            .unwrap_or(Money::from_micros(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_price_file_overrides_the_defaults() {
        let list = PriceList::from_toml(
            "per_gb_hour = \"0.05\"\n[gpu]\n\"RTX 4090\" = \"2.20\"\n\"rtx-3090\" = \"1\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            list.price_per_gpu_hour(&t("RTX4090"), 24_564).to_string(),
            "2.20"
        );
        assert_eq!(
            list.price_per_gpu_hour(&t("RTX 3090"), 24_576).to_string(),
            "1.00"
        );
        assert_eq!(
            list.price_per_gpu_hour(&t("H200"), 143_771).to_string(),
            "9.00"
        );
        assert_eq!(
            list.price_per_gpu_hour(&t("T4"), 15_360).to_string(),
            "0.75"
        );
    }

    #[test]
    fn a_bad_price_file_says_what_is_wrong() {
        let cases = [
            ("[gpu]\n\"RTX 4090\" = \"-1\"", "RTX 4090"),
            ("[gpu]\n\"RTX 4090\" = \"2.5.0\"", "RTX 4090"),
            ("[gpu]\n\"RTX;4090\" = \"2.50\"", "RTX;4090"),
            ("per_gb_hour = \"0\"", "per_gb_hour"),
            ("colour = \"blue\"", "colour"),
            ("[gpu", "TOML"),
            ("[spot]\nmin_bid_percent = 0", "spot.min_bid_percent"),
            (
                "[reserved]\ndiscounts = [{ min_hours = 24, percent = 100 }]",
                "reserved",
            ),
            ("[stepped]\nfirst_hours = 0", "stepped.first_hours"),
            ("[shares]\nper_gb_hour = \"x\"", "shares.per_gb_hour"),
            ("[stepped]\nsteps = 3", "steps"),
            ("host_share_percent = 101", "host_share_percent"),
            ("[spot]\ngrace_seconds = 99999", "spot.grace_seconds"),
        ];
        for (text, mentions) in cases {
            let err = PriceList::from_toml(text).map(|_| ()).unwrap_err();
            assert!(err.to_string().contains(mentions), "{text}: {err}");
        }
    }

    #[test]
    fn the_documented_example_parses() {
        let text = "per_gb_hour = \"0.08\"\nprepaid_hours = 2\nhost_share_percent = 75\n\
            [gpu]\n\"RTX 4090\" = \"2.20\"\n[shares]\nper_gb_hour = \"0.40\"\n\
            [stepped]\nfirst_hours = 2\nfirst_per_gb_hour = \"1.50\"\nthen_per_gb_hour = \"1.00\"\n\
            [reserved]\ndiscounts = [{ min_hours = 168, percent = 30 }, { min_hours = 24, percent = 20 }]\n\
            [spot]\nmin_bid_percent = 50\ngrace_seconds = 10\n";
        let list = PriceList::from_toml(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(list.prepaid_hours, 2);
        assert_eq!(list.host_share_bps, 7_500);
        assert_eq!(list.share_per_gb_hour.to_string(), "0.40");
        assert_eq!(list.stepped.first_hours, 2);
        assert_eq!(list.reserved_discounts, vec![(24, 20), (168, 30)]);
        assert_eq!((list.spot_min_bid_percent, list.spot_grace_s), (50, 10));
    }

    fn t(name: &str) -> GpuType {
        GpuType::parse(name).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn known_models_use_the_list_and_others_their_memory() {
        let list = PriceList::defaults();
        assert_eq!(
            list.price_per_gpu_hour(&t("rtx-4090"), 24_564).to_string(),
            "2.50"
        );
        assert_eq!(
            list.price_per_gpu_hour(&t("NVIDIA H200"), 143_771)
                .to_string(),
            "9.00"
        );
        assert_eq!(
            list.price_per_gpu_hour(&t("T4"), 15_360).to_string(),
            "1.50"
        );
        let custom = list.with_price(&t("T4"), Money::units(1));
        assert_eq!(custom.price_per_gpu_hour(&t("t4"), 15_360), Money::units(1));
    }
}
