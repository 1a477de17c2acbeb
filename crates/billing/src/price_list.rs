//! The on-demand price of one whole GPU per hour, by model, with defaults from the seeds.

use std::collections::BTreeMap;

use gpurent_types::{GpuType, Money};

/// Price per whole GPU-hour by GPU type key. Unlisted models are priced by memory size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceList {
    per_gpu_hour: BTreeMap<String, Money>,
    per_gb_hour_fallback: Money,
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

/// A price file, as an owner writes it:
///
/// ```toml
/// # Price of one whole GPU for one hour, by model (names as `gpurent offers` shows them).
/// [gpu]
/// "RTX 4090" = "2.20"
/// "H100-80GB" = "6.50"
///
/// # Models not listed cost this much per GB of memory per hour.
/// per_gb_hour = "0.08"
/// ```
///
/// Models it does not name keep their defaults.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    #[serde(default)]
    gpu: BTreeMap<String, String>,
    per_gb_hour: Option<String>,
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
        ];
        for (text, mentions) in cases {
            let err = PriceList::from_toml(text).map(|_| ()).unwrap_err();
            assert!(err.to_string().contains(mentions), "{text}: {err}");
        }
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
