//! The price plans of a deployment: the on-demand price of one whole GPU per hour by model,
//! everything else relative to it; defaults, and the owner's price file over them.

use std::collections::BTreeMap;

use gpurent_types::{GpuType, Money};

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

/// A price file, as an owner writes it (every key is optional; what it does not name keeps
/// its default). Every tier but on-demand is relative to on-demand, so no tier and no share
/// costs more than the whole card:
///
/// ```toml
/// # The platform's currency (ISO 4217), shown with every amount. The built-in prices are
/// # USD: a file in another currency names its own (per_gb_hour, or [gpu] prices).
/// currency = "USD"
/// # Models not listed under [gpu] cost this much per GB of memory per hour (default: the
/// # median per-GB price of the listed models gpurent knows the memory of).
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
/// # Shares of a GPU (`--vram-gb`, `--vram-fraction`): their fraction of the card's
/// # on-demand price, plus this premium, and never more than the whole card.
/// [shares]
/// premium_percent = 0
///
/// # The duration-stepped tier (`--tier stepped`): percent of the on-demand price for the
/// # first hours, then after them.
/// [stepped]
/// first_hours = 3
/// first_percent = 100
/// then_percent = 60
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
///
/// `[shares] per_gb_hour = "0.10"` still sets an explicit per-GB price of shares instead of
/// the fraction (the server warns at start-up for each card it makes a share dearer than).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    currency: Option<String>,
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
    premium_percent: Option<u32>,
    per_gb_hour: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SteppedFile {
    first_hours: Option<u32>,
    first_percent: Option<u32>,
    then_percent: Option<u32>,
    // Refused with what replaced them: a per-GB price of its own made the stepped tier cost
    // 19 times the on-demand price of an RTX 4090.
    first_per_gb_hour: Option<toml::Value>,
    then_per_gb_hour: Option<toml::Value>,
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

fn percent(
    what: &str,
    value: u32,
    range: std::ops::RangeInclusive<u32>,
) -> Result<u32, PriceListError> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(setting(
            what,
            &format!("must be from {} to {}", range.start(), range.end()),
        ))
    }
}

/// ISO 4217's shape: three capital letters (`USD`, `CNY`, `EUR`).
fn currency(value: &str) -> Result<String, PriceListError> {
    if value.len() == 3 && value.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(value.to_owned())
    } else {
        Err(setting(
            "currency",
            &format!("{value:?} is not a currency code: three capital letters (ISO 4217), like \"USD\" or \"CNY\""),
        ))
    }
}

/// `micros × num / den`, rounded up to the micro-unit.
pub(crate) fn mul_div_ceil(m: Money, num: u64, den: u64) -> Option<Money> {
    let den = i128::from(den.max(1));
    let v = (i128::from(m.micros()) * i128::from(num) + den - 1) / den;
    i64::try_from(v).ok().map(Money::from_micros)
}

impl PriceList {
    /// The defaults, overridden by a price file (see [`PriceFile`] for its format).
    pub fn from_toml(text: &str) -> Result<Self, PriceListError> {
        let file: PriceFile = toml::from_str(text).map_err(PriceListError::Toml)?;
        let mut list = PriceList::defaults();
        if let Some(code) = &file.currency {
            list.currency = currency(code)?;
        }
        if list.currency != DEFAULT_CURRENCY {
            // The built-in prices are USD figures: in yuan they would be a seventh of a price.
            list.per_gpu_hour.clear();
            if file.per_gb_hour.is_none() && file.gpu.is_empty() {
                return Err(setting(
                    "currency",
                    &format!(
                        "the built-in prices are in {DEFAULT_CURRENCY}; a price file in {} gives its own: per_gb_hour (and [gpu] prices) in {}",
                        list.currency, list.currency
                    ),
                ));
            }
        }
        for (model, value) in &file.gpu {
            let gpu_type = GpuType::parse(model).map_err(|e| PriceListError::Price {
                what: model.clone(),
                value: value.clone(),
                reason: e.to_string(),
            })?;
            list = list.with_price(&gpu_type, price(model, value)?);
        }
        match &file.per_gb_hour {
            Some(value) => {
                list.per_gb_hour_fallback = price("per_gb_hour", value)?;
                list.per_gb_hour_explicit = true;
            }
            None => {
                list.per_gb_hour_fallback = list.derived_per_gb_hour().ok_or_else(|| {
                    setting(
                        "per_gb_hour",
                        "no model gpurent knows the memory of is listed under [gpu], so unlisted models need per_gb_hour",
                    )
                })?;
            }
        }
        if let Some(hours) = file.prepaid_hours {
            if hours > 24 * 31 {
                return Err(setting("prepaid_hours", "must be at most 744 (a month)"));
            }
            list.prepaid_hours = hours;
        }
        if let Some(shares) = &file.shares {
            if let Some(p) = shares.premium_percent {
                list.share_premium_percent = percent("shares.premium_percent", p, 0..=100)?;
            }
            if let Some(v) = &shares.per_gb_hour {
                if shares.premium_percent.is_some() {
                    return Err(setting(
                        "shares",
                        "give premium_percent (a share costs its fraction of the card, plus it) or per_gb_hour (a price of its own), not both",
                    ));
                }
                list.share_per_gb_hour = Some(price("shares.per_gb_hour", v)?);
            }
        }
        if let Some(stepped) = &file.stepped {
            if stepped.first_per_gb_hour.is_some() || stepped.then_per_gb_hour.is_some() {
                return Err(setting(
                    "stepped.first_per_gb_hour/then_per_gb_hour",
                    "replaced by first_percent and then_percent, in percent of the on-demand price (defaults 100 and 60), so the tier never costs more than on-demand",
                ));
            }
            if let Some(hours) = stepped.first_hours {
                if hours == 0 || hours > 24 * 366 {
                    return Err(setting(
                        "stepped.first_hours",
                        "must be from 1 to 8784 (a year)",
                    ));
                }
                list.stepped.first_hours = hours;
            }
            if let Some(p) = stepped.first_percent {
                list.stepped.first_percent = percent("stepped.first_percent", p, 1..=100)?;
            }
            if let Some(p) = stepped.then_percent {
                list.stepped.then_percent = percent("stepped.then_percent", p, 1..=100)?;
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
            if let Some(p) = spot.min_bid_percent {
                list.spot_min_bid_percent = percent("spot.min_bid_percent", p, 1..=100)?;
            }
            if let Some(grace) = spot.grace_seconds {
                if grace > 3600 {
                    return Err(setting("spot.grace_seconds", "must be at most 3600"));
                }
                list.spot_grace_s = grace;
            }
        }
        if let Some(p) = file.host_share_percent {
            list.host_share_bps = percent("host_share_percent", p, 0..=100)? * 100;
        }
        Ok(list)
    }

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
mod tests {
    use super::*;

    fn t(name: &str) -> GpuType {
        GpuType::parse(name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse(text: &str) -> PriceList {
        PriceList::from_toml(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn a_price_file_overrides_the_defaults() {
        let list =
            parse("per_gb_hour = \"0.05\"\n[gpu]\n\"RTX 4090\" = \"2.20\"\n\"rtx-3090\" = \"1\"\n");
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
        assert_eq!(list.currency(), "USD");
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
            ("[stepped]\nthen_percent = 0", "stepped.then_percent"),
            ("[stepped]\nfirst_percent = 101", "stepped.first_percent"),
            ("[shares]\nper_gb_hour = \"x\"", "shares.per_gb_hour"),
            ("[shares]\npremium_percent = 101", "shares.premium_percent"),
            (
                "[shares]\npremium_percent = 5\nper_gb_hour = \"0.10\"",
                "not both",
            ),
            ("[stepped]\nsteps = 3", "steps"),
            ("host_share_percent = 101", "host_share_percent"),
            ("[spot]\ngrace_seconds = 99999", "spot.grace_seconds"),
            ("currency = \"usd\"", "three capital letters"),
            ("currency = \"EURO\"", "currency"),
            ("currency = \"CNY\"", "built-in prices are in USD"),
            (
                "currency = \"CNY\"\n[gpu]\n\"T4\" = \"5\"",
                "unlisted models need per_gb_hour",
            ),
        ];
        for (text, mentions) in cases {
            let err = PriceList::from_toml(text).map(|_| ()).unwrap_err();
            assert!(err.to_string().contains(mentions), "{text}: {err}");
        }
    }

    /// The old per-GB keys of the stepped tier are refused with what replaced them.
    #[test]
    fn the_old_stepped_keys_say_what_replaced_them() {
        let err = PriceList::from_toml("[stepped]\nfirst_per_gb_hour = \"2.00\"")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("first_percent") && err.contains("then_percent"),
            "{err}"
        );
    }

    #[test]
    fn the_documented_example_parses() {
        let text = "currency = \"USD\"\nper_gb_hour = \"0.08\"\nprepaid_hours = 2\nhost_share_percent = 75\n\
            [gpu]\n\"RTX 4090\" = \"2.20\"\n[shares]\npremium_percent = 10\n\
            [stepped]\nfirst_hours = 2\nfirst_percent = 90\nthen_percent = 50\n\
            [reserved]\ndiscounts = [{ min_hours = 168, percent = 30 }, { min_hours = 24, percent = 20 }]\n\
            [spot]\nmin_bid_percent = 50\ngrace_seconds = 10\n";
        let list = parse(text);
        assert_eq!(list.prepaid_hours, 2);
        assert_eq!(list.host_share_bps, 7_500);
        assert_eq!(list.share_premium_percent, 10);
        assert_eq!(list.share_per_gb_hour, None);
        assert_eq!(
            list.stepped,
            Stepped {
                first_hours: 2,
                first_percent: 90,
                then_percent: 50
            }
        );
        assert_eq!(list.reserved_discounts, vec![(24, 20), (168, 30)]);
        assert_eq!((list.spot_min_bid_percent, list.spot_grace_s), (50, 10));
        assert_eq!(list.per_gb_hour_fallback().to_string(), "0.08");
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
        // 15 GB at the median per-GB price of the listed models.
        assert_eq!(
            list.price_per_gpu_hour(&t("T4"), 15_360).to_string(),
            "0.984945"
        );
        let custom = list.with_price(&t("T4"), Money::units(1));
        assert_eq!(custom.price_per_gpu_hour(&t("t4"), 15_360), Money::units(1));
    }

    /// Unlisted models cost per GB what the listed ones cost in the middle: no unlisted card
    /// is dearer per GB than the dearest listed one nor cheaper than the cheapest.
    #[test]
    fn the_per_gb_price_of_unlisted_models_is_the_listed_models_median() {
        let list = PriceList::defaults();
        let per_gb: Vec<Money> = known_models()
            .map(|(t, gb)| {
                mul_div_ceil(list.price_per_gpu_hour(&t, 0), 1, u64::from(gb))
                    .unwrap_or(Money::ZERO)
            })
            .collect();
        let fallback = list.per_gb_hour_fallback();
        assert_eq!(fallback, Money::from_micros(65_663));
        let below = per_gb.iter().filter(|p| **p < fallback).count();
        let above = per_gb.iter().filter(|p| **p > fallback).count();
        assert_eq!((below, above), (6, 6), "{per_gb:?}");
        // The owner's prices move it: every listed model at 0.10 per GB makes it 0.10.
        let mut text = String::from("[gpu]\n");
        for (t, gb) in known_models() {
            text.push_str(&format!(
                "\"{}\" = \"{}\"\n",
                t,
                Money::from_micros(100_000 * i64::from(gb))
            ));
        }
        assert_eq!(parse(&text).per_gb_hour_fallback().to_string(), "0.10");
    }

    /// A file in another currency drops the built-in (USD) prices: what it does not price is
    /// priced per GB in its own currency.
    #[test]
    fn another_currency_prices_everything_itself() {
        let list = parse("currency = \"CNY\"\nper_gb_hour = \"0.50\"\n[gpu]\n\"H200\" = \"60\"\n");
        assert_eq!(list.currency(), "CNY");
        assert_eq!(
            list.price_per_gpu_hour(&t("RTX 4090"), 24_564).to_string(),
            "12.00"
        );
        assert_eq!(
            list.price_per_gpu_hour(&t("H200"), 143_771).to_string(),
            "60.00"
        );
        // Without per_gb_hour, unlisted models follow the listed ones it knows the memory of.
        let list = parse("currency = \"EUR\"\n[gpu]\n\"RTX 4090\" = \"2.40\"\n");
        assert_eq!(list.per_gb_hour_fallback().to_string(), "0.10");
    }
}
