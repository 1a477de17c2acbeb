//! Golden tests of the prices as `gpurent offers` shows them: the defaults, model by model,
//! and the example price file of the seeds (`deploy/prices/seeds-cny.toml`).

use gpurent_types::{GpuType, Money, Tier};
use proptest::prelude::*;

use crate::price_list::known_models;
use crate::{PriceList, Size};

/// The seeds' prices in yuan, the file that ships (read here so that it cannot rot).
const SEEDS_CNY: &str = include_str!("../../../deploy/prices/seeds-cny.toml");

/// Cards as their drivers report them, where that is not a round number of GB.
fn card_mb(t: &GpuType, gb: u32) -> u64 {
    match t.key() {
        "rtx4090" => 24_564,
        "h200" => 143_771,
        _ => u64::from(gb) * 1024,
    }
}

fn whole(gpu_vram_mb: u64) -> Size {
    Size::Whole {
        count: 1,
        gpu_vram_mb,
    }
}

fn share(vram_mb: u64, gpu_vram_mb: u64) -> Size {
    Size::Share {
        vram_mb,
        gpu_vram_mb,
    }
}

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// One line per model as `gpurent offers` shows it: the whole GPU's on-demand price, the
/// stepped tier's first and later price, the lowest spot bid, a share's price per GB.
fn offers_table(list: &PriceList) -> String {
    let mut out = String::new();
    for (t, gb) in known_models() {
        let mb = card_mb(&t, gb);
        let one = whole(mb);
        let stepped = ok(list.stepped_rate(&t, one));
        out.push_str(&format!(
            "{t} {gb} GB: {} | stepped {} then {} | spot from {} | share {}/GB\n",
            ok(list.on_demand_per_hour(&t, one)),
            stepped.first,
            stepped.then,
            ok(list.spot_min_bid(&t, one)),
            ok(list.on_demand_per_hour(&t, share(1024, mb))),
        ));
    }
    out
}

#[test]
fn the_default_offers() {
    assert_eq!(
        offers_table(&PriceList::defaults()),
        "\
RTX-3090 24 GB: 1.20 | stepped 1.20 then 0.72 | spot from 0.48 | share 0.05/GB
RTX-4090 24 GB: 2.50 | stepped 2.50 then 1.50 | spot from 1.00 | share 0.104218/GB
RTX-5090 32 GB: 3.50 | stepped 3.50 then 2.10 | spot from 1.40 | share 0.109375/GB
L4 24 GB: 1.00 | stepped 1.00 then 0.60 | spot from 0.40 | share 0.041667/GB
L40S 48 GB: 3.00 | stepped 3.00 then 1.80 | spot from 1.20 | share 0.0625/GB
A10 24 GB: 1.10 | stepped 1.10 then 0.66 | spot from 0.44 | share 0.045834/GB
A100-40GB 40 GB: 3.00 | stepped 3.00 then 1.80 | spot from 1.20 | share 0.075/GB
A100-80GB 80 GB: 4.00 | stepped 4.00 then 2.40 | spot from 1.60 | share 0.05/GB
H100-80GB 80 GB: 7.00 | stepped 7.00 then 4.20 | spot from 2.80 | share 0.0875/GB
H100 80 GB: 7.00 | stepped 7.00 then 4.20 | spot from 2.80 | share 0.0875/GB
H200 140 GB: 9.00 | stepped 9.00 then 5.40 | spot from 3.60 | share 0.064102/GB
B200 179 GB: 12.00 | stepped 12.00 then 7.20 | spot from 4.80 | share 0.06704/GB
"
    );
}

/// Every default model: half a card costs half the card, a share of all of it the card, the
/// stepped tier starts at on-demand and goes on at 60%, and no tier of a share or of the card
/// costs more than the card on demand.
#[test]
fn every_default_price_is_coherent() {
    let list = PriceList::defaults();
    assert_eq!(list.incoherences(), Vec::new());
    for (t, gb) in known_models() {
        let mb = card_mb(&t, gb);
        let card = ok(list.on_demand_per_hour(&t, whole(mb)));
        let half = ok(list.on_demand_per_hour(&t, share(mb / 2, mb)));
        let twice_half = ok(half.checked_mul(2).ok_or("overflow"));
        // Rounded up to the micro-unit, and an odd MiB short of half (the H200's 143,771).
        let slack = card.micros() / i64::try_from(mb).unwrap_or(1) + 2;
        assert!(
            (twice_half.micros() - card.micros()).abs() <= slack,
            "{t}: half {half}, card {card}"
        );
        assert_eq!(ok(list.on_demand_per_hour(&t, share(mb, mb))), card, "{t}");
        let stepped = ok(list.stepped_rate(&t, whole(mb)));
        assert_eq!(stepped.first, card, "{t}");
        assert_eq!(
            stepped.then.micros(),
            (card.micros() * 60 + 99) / 100,
            "{t}"
        );
        for size in [whole(mb), share(mb / 3, mb), share(mb, mb)] {
            let on_demand = ok(list.on_demand_per_hour(&t, size));
            assert!(on_demand <= card, "{t} {size:?}");
            for tier in [Tier::OnDemand, Tier::Stepped, Tier::Reserved, Tier::Spot] {
                let q = ok(list.quote(&t, size, 24 * 3600, tier, None));
                assert!(
                    q.rate.first <= on_demand && q.rate.then <= on_demand,
                    "{t} {size:?} {tier}: {q:?}"
                );
            }
        }
    }
}

/// The seeds' numbers in yuan: 0.5 per GB-hour for every card and its shares, the stepped
/// tier at the seeds' shape.
#[test]
fn the_seeds_price_file_quotes_the_seeds() {
    let list = ok(PriceList::from_toml(SEEDS_CNY));
    assert_eq!(list.currency(), "CNY");
    assert_eq!(list.incoherences(), Vec::new());
    let a100 = ok(GpuType::parse("A100-40GB"));
    let a100_mb = 40 * 1024;
    assert_eq!(
        ok(list.on_demand_per_hour(&a100, whole(a100_mb))).to_string(),
        "20.00"
    );
    // One of the seeds' 8 GB vGPU slices of an A100 40GB.
    let slice = ok(list.on_demand_per_hour(&a100, share(8 * 1024, a100_mb)));
    assert_eq!(slice.to_string(), "4.00");
    // The seeds' example: 72 hours on four A100s, on demand and stepped.
    let four = Size::Whole {
        count: 4,
        gpu_vram_mb: a100_mb,
    };
    let hours_72 = 72 * 3600;
    let q = ok(list.quote(&a100, four, hours_72, Tier::OnDemand, None));
    assert_eq!(q.rate.charge_for_seconds(hours_72).to_string(), "5760.00");
    let q = ok(list.quote(&a100, four, hours_72, Tier::Stepped, None));
    assert_eq!(
        (q.rate.first.to_string(), q.rate.then.to_string()),
        ("80.00".into(), "48.00".into())
    );
    assert_eq!(q.rate.charge_for_seconds(hours_72).to_string(), "3552.00");
    let expected = "\
RTX-3090 24 GB: 12.00 | stepped 12.00 then 7.20 | spot from 4.80 | share 0.50/GB
RTX-4090 24 GB: 12.00 | stepped 12.00 then 7.20 | spot from 4.80 | share 0.500245/GB
RTX-5090 32 GB: 16.00 | stepped 16.00 then 9.60 | spot from 6.40 | share 0.50/GB
L4 24 GB: 12.00 | stepped 12.00 then 7.20 | spot from 4.80 | share 0.50/GB
L40S 48 GB: 24.00 | stepped 24.00 then 14.40 | spot from 9.60 | share 0.50/GB
A10 24 GB: 12.00 | stepped 12.00 then 7.20 | spot from 4.80 | share 0.50/GB
A100-40GB 40 GB: 20.00 | stepped 20.00 then 12.00 | spot from 8.00 | share 0.50/GB
A100-80GB 80 GB: 40.00 | stepped 40.00 then 24.00 | spot from 16.00 | share 0.50/GB
H100-80GB 80 GB: 40.00 | stepped 40.00 then 24.00 | spot from 16.00 | share 0.50/GB
H100 80 GB: 40.00 | stepped 40.00 then 24.00 | spot from 16.00 | share 0.50/GB
H200 140 GB: 70.00 | stepped 70.00 then 42.00 | spot from 28.00 | share 0.498571/GB
B200 179 GB: 89.50 | stepped 89.50 then 53.70 | spot from 35.80 | share 0.50/GB
";
    assert_eq!(offers_table(&list), expected);
}

/// An explicit per-GB share price above a card's per-GB price is named, card by card.
#[test]
fn a_share_dearer_than_its_card_is_named() {
    let list = ok(PriceList::from_toml("[shares]\nper_gb_hour = \"0.50\"\n"));
    let found = list.incoherences();
    let text: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(found.len(), known_models().count() + 1, "{text:#?}");
    assert!(
        text.iter()
            .any(|t| t.contains("all 24 GB of one RTX-4090 costs 12.00/h")
                && t.contains("whole card's 2.50/h")
                && t.contains("premium_percent")),
        "{text:#?}"
    );
    // At or below every card's per-GB price: nothing to say.
    let list = ok(PriceList::from_toml("[shares]\nper_gb_hour = \"0.04\"\n"));
    assert_eq!(list.incoherences(), Vec::new());
}

#[test]
fn a_premium_raises_shares_but_never_past_the_card() {
    let list = ok(PriceList::from_toml("[shares]\npremium_percent = 20\n"));
    let t = ok(GpuType::parse("RTX 4090"));
    let mb = 24_564;
    // Half: 1.25 + 20%.
    assert_eq!(
        ok(list.on_demand_per_hour(&t, share(mb / 2, mb))).to_string(),
        "1.50"
    );
    // Nine tenths would be 2.70: the card's 2.50 instead.
    assert_eq!(
        ok(list.on_demand_per_hour(&t, share(mb * 9 / 10, mb))).to_string(),
        "2.50"
    );
}

fn model() -> impl Strategy<Value = (GpuType, u32)> {
    proptest::sample::select(known_models().collect::<Vec<_>>())
}

proptest! {
    /// A share never costs more than its card, on any tier, with any premium; and a larger
    /// share never costs less than a smaller one.
    #[test]
    fn shares_are_never_dearer_than_the_card_and_grow_with_size(
        (t, gb) in model(),
        premium in 0u32..=100,
        a in 1u64..200_000,
        b in 1u64..200_000,
        card_micros in 1i64..100_000_000,
    ) {
        let list = ok(PriceList::from_toml(&format!("[shares]\npremium_percent = {premium}\n")))
            .with_price(&t, Money::from_micros(card_micros));
        let mb = card_mb(&t, gb);
        let (lo, hi) = (a.min(b).min(mb), a.max(b).min(mb));
        let card = ok(list.on_demand_per_hour(&t, whole(mb)));
        let small = ok(list.on_demand_per_hour(&t, share(lo, mb)));
        let large = ok(list.on_demand_per_hour(&t, share(hi, mb)));
        prop_assert!(small <= large, "{} MiB {} > {} MiB {}", lo, small, hi, large);
        prop_assert!(large <= card);
        for tier in [Tier::Stepped, Tier::Reserved, Tier::Spot] {
            let q = ok(list.quote(&t, share(hi, mb), 24 * 3600, tier, None));
            prop_assert!(q.rate.first <= card && q.rate.then <= card);
        }
    }
}

/// The operators' guide's price-file example is one the server takes, and says what it says.
#[test]
fn the_documented_price_file_parses() {
    let guide = include_str!("../../../docs/operators.md");
    let block = guide
        .split("```toml\n")
        .find(|b| b.starts_with("currency = "))
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("docs/operators.md has no price-file example"));
    let list = PriceList::from_toml(block).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        list.price_per_gpu_hour(
            &GpuType::parse("RTX 4090").unwrap_or_else(|e| panic!("{e}")),
            24_564
        )
        .to_string(),
        "2.20"
    );
}
