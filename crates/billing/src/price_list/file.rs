//! The price file: an owner's TOML over the defaults, each bad key refused with why.

use std::collections::BTreeMap;

use gpurent_types::{GpuType, Money};

use super::{PriceList, DEFAULT_CURRENCY};

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
///
/// # Volumes (`gpurent volumes create`): per GB (10^9 bytes) of their size per month
/// # (730 hours), charged per second. A file in another currency than USD gives it.
/// [storage]
/// per_gb_month = "0.07"
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
    storage: Option<StorageFile>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StorageFile {
    per_gb_month: String,
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
        match &file.storage {
            Some(storage) => {
                list.storage_per_gb_month = price("storage.per_gb_month", &storage.per_gb_month)?;
            }
            None if list.currency != DEFAULT_CURRENCY => {
                return Err(setting(
                    "storage",
                    &format!(
                        "the built-in volume price is 0.07 {DEFAULT_CURRENCY} per GB-month; a price file in {} gives its own: [storage] per_gb_month",
                        list.currency
                    ),
                ));
            }
            None => {}
        }
        if let Some(p) = file.host_share_percent {
            list.host_share_bps = percent("host_share_percent", p, 0..=100)? * 100;
        }
        Ok(list)
    }
}
