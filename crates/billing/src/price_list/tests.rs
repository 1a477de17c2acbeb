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
        (
            "currency = \"CNY\"\nper_gb_hour = \"0.50\"",
            "[storage] per_gb_month",
        ),
        ("[storage]\nper_gb_month = \"0\"", "storage.per_gb_month"),
        ("[storage]\nper_gb_month = 0.07", "per_gb_month"),
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
            mul_div_ceil(list.price_per_gpu_hour(&t, 0), 1, u64::from(gb)).unwrap_or(Money::ZERO)
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
    let list = parse(
        "currency = \"CNY\"\nper_gb_hour = \"0.50\"\n[gpu]\n\"H200\" = \"60\"\n[storage]\nper_gb_month = \"0.50\"\n",
    );
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
    let list = parse(
        "currency = \"EUR\"\n[gpu]\n\"RTX 4090\" = \"2.40\"\n[storage]\nper_gb_month = \"0.06\"\n",
    );
    assert_eq!(list.per_gb_hour_fallback().to_string(), "0.10");
}

/// Volumes cost 0.07 per GB-month unless the file says otherwise.
#[test]
fn storage_has_a_price_of_its_own() {
    assert_eq!(
        PriceList::defaults().storage_per_gb_month.to_string(),
        "0.07"
    );
    let list = parse("[storage]\nper_gb_month = \"0.10\"\n");
    assert_eq!(list.storage_per_gb_month.to_string(), "0.10");
}
