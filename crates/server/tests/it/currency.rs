//! The platform's currency from the price file (`currency = "CNY"`, the seeds' example file):
//! in offers, the balance, invoices and their CSV, and the console's amounts; the prices are
//! the file's.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::login;

const SEEDS_CNY: &str = include_str!("../../../../deploy/prices/seeds-cny.toml");

async fn the_currency_is_shown_with_every_amount(backend: Backend) {
    // The manual clock starts on 2026-03-01 12:00 UTC.
    let mut app = TestApp::with(backend)
        .with_manual_clock()
        .with_prices(SEEDS_CNY)
        .start()
        .await;
    app.add_node("box", "1xRTX4090").await;
    let t = app.tenant("tess", "100").await;

    let (_, offers) = t.client.get("/api/v1/offers").await;
    let o = &offers[0];
    assert_eq!(
        (
            &o["currency"],
            &o["price_per_hour"],
            &o["stepped_price_per_hour"],
            &o["stepped_then_per_hour"],
            &o["spot_min_bid"],
            &o["reserved_discounts"][0]["price_per_hour"],
        ),
        (
            &json!("CNY"),
            &json!("12.00"),
            &json!("12.00"),
            &json!("7.20"),
            &json!("4.80"),
            &json!("9.60")
        ),
        "{offers}"
    );
    let (_, balance) = t.client.get("/api/v1/balance").await;
    assert_eq!(
        (&balance["balance"], &balance["currency"]),
        (&json!("100.00"), &json!("CNY"))
    );

    // Half the card for 61 s: 6.00 yuan an hour.
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "vram_fraction": 0.5}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["price_per_hour"], "6.00");
    let id = r["id"].as_str().unwrap_or_default().to_owned();
    app.wait_status(&t.client, &id, "running").await;
    app.advance(Duration::seconds(61));
    app.maintenance_tick().await;
    t.client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    let done = app.wait_status(&t.client, &id, "stopped").await;
    let charged = done["charged"].as_str().unwrap_or_default().to_owned();
    assert_ne!(charged, "0.00");

    let (status, invoice) = t.client.get("/api/v1/invoices/2026-03").await;
    assert_eq!(status, StatusCode::OK, "{invoice}");
    assert_eq!(
        (&invoice["currency"], &invoice["total"]),
        (&json!("CNY"), &json!(charged))
    );
    let (_, csv, _) = t
        .client
        .get_text("/api/v1/invoices/2026-03?format=csv", "content-type")
        .await;
    let rows: Vec<&str> = csv.lines().collect();
    assert!(
        rows.len() == 3
            && rows[1..]
                .iter()
                .all(|r| r.ends_with(&format!(",{charged},CNY,,,,"))),
        "{csv}"
    );

    let console = login(&app, &t, "tess").await;
    let page = console.get("/billing").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    page.assert_has(&format!(
        "data-field=\"invoice-total\"><span class=\"money\">{charged} CNY</span>"
    ));
    assert!(!page.html.contains(" USD<"), "{}", page.html);
    let offers_page = console.get("/offers").await;
    offers_page.assert_has("<span class=\"money\">12.00 CNY</span>");
    app.shutdown().await;
}
both_stores!(
    the_currency_is_shown_with_every_amount_,
    the_currency_is_shown_with_every_amount
);
