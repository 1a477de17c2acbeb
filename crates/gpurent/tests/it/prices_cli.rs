//! Prices through the CLI: `offers` shows every tier's price for one whole GPU, a share of all
//! of a card (`--vram-gb 24` on a 24,564 MiB RTX 4090) or half of it (`--vram-fraction 0.5`)
//! is reserved at its part of the card's price, the currency comes from the price file, and
//! a price file that makes a share dearer than its card is warned of at start-up (`server` and `up`).

use std::path::Path;

use crate::support::{cli, read_token, Daemon};

const SEEDS_CNY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/prices/seeds-cny.toml"
);

fn tenant(url: &str, admin: &str) -> String {
    let run = cli(
        url,
        Some(admin),
        true,
        &["users", "create", "tess", "--credit", "100"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    run.json()["token"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn offers_show_whole_gpu_tiers_and_a_share_may_be_all_of_a_card() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = Daemon::up_sim(&data, "2xRTX4090", &[], &dir.path().join("up.log"));
    let token = tenant(&up.url, &read_token(&data));
    let t = Some(token.as_str());

    let offers = cli(&up.url, t, false, &["offers"]);
    assert_eq!(offers.code, 0, "{offers:?}");
    let row = offers
        .stdout
        .lines()
        .find(|l| l.starts_with("RTX4090"))
        .unwrap_or_else(|| panic!("no RTX4090 row: {}", offers.stdout));
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        [
            "RTX4090",
            "24",
            "2",
            "2.50",
            "2.50 then 1.50",
            "1.00",
            "2.00 / 1.75 / 1.50",
            "0.104218"
        ],
        "{}",
        offers.stdout
    );
    for line in [
        "prices in USD for one whole GPU",
        "stepped: the first price for 3 h, then the second",
        "reserved blocks: 20% off from 24 h, 30% off from 168 h, 40% off from 720 h",
    ] {
        assert!(
            offers.stdout.contains(line),
            "{line:?} in {}",
            offers.stdout
        );
    }

    // 24 GB of a 24,564 MiB card is all of it, at the card's price.
    let all = cli(
        &up.url,
        t,
        true,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--vram-gb",
            "24",
            "--hours",
            "1",
        ],
    );
    assert_eq!(all.code, 0, "{all:?}");
    let all = all.json();
    assert_eq!(
        (all["vram_gb"].as_u64(), all["price_per_hour"].as_str()),
        (Some(24), Some("2.50")),
        "{all}"
    );
    let half = cli(
        &up.url,
        t,
        false,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--vram-fraction",
            "0.5",
            "--hours",
            "1",
        ],
    );
    assert_eq!(half.code, 0, "{half:?}");
    assert!(
        half.stdout.contains("12 GB of one RTX4090") && half.stdout.contains("at 1.25/h"),
        "{}",
        half.stdout
    );
    let both = cli(
        &up.url,
        t,
        false,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--vram-fraction",
            "0.5",
            "--vram-gb",
            "8",
            "--hours",
            "1",
        ],
    );
    assert_ne!(both.code, 0, "{both:?}");
    assert!(both.stderr.contains("--vram-gb"), "{}", both.stderr);

    // 100 less the first hours held: 2.50 + 1.25.
    let balance = cli(&up.url, t, false, &["balance"]);
    assert_eq!(balance.code, 0, "{balance:?}");
    assert!(
        balance.stdout.contains("96.25 USD")
            && balance.stdout.contains("held for reservations: 3.75 USD"),
        "{}",
        balance.stdout
    );
}

fn server_with_prices(dir: &Path, prices: &str, log: &Path) -> Daemon {
    let data = dir.join("data");
    Daemon::start(
        &[
            "server",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--prices",
            prices,
        ],
        log,
    )
}

#[test]
fn the_price_file_sets_the_currency_and_a_share_dearer_than_its_card_is_warned_of() {
    // The seeds' file: yuan, and nothing to warn of.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let server = server_with_prices(dir.path(), SEEDS_CNY, &log);
    let token = tenant(&server.url, &read_token(&dir.path().join("data")));
    let balance = cli(&server.url, Some(&token), false, &["balance"]);
    assert_eq!(balance.stdout.trim(), "100.00 CNY", "{balance:?}");
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("warning: the price file"), "{text}");

    // The old per-GB share price, 0.50: a share of all of an RTX 4090 would cost 12.00.
    let dir = tempfile::tempdir().unwrap();
    let prices = dir.path().join("prices.toml");
    std::fs::write(&prices, "[shares]\nper_gb_hour = \"0.50\"\n").unwrap();
    let log = dir.path().join("up.log");
    let data = dir.path().join("data");
    let up = Daemon::up_sim(
        &data,
        "1xRTX4090",
        &["--prices", prices.to_str().unwrap()],
        &log,
    );
    drop(up);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning: the price file") && l.contains("RTX-4090"))
        .unwrap_or_else(|| panic!("no warning for the RTX 4090 in {text}"));
    assert!(
        warning.contains("costs 12.00/h") && warning.contains("whole card's 2.50/h"),
        "{warning}"
    );
}
