//! The console's billing page: the balance, holds and earnings the API gives, usage per day as
//! a chart and a table and per instance, the month's invoice with its total, and its CSV
//! download the same bytes as the API's (`gpurent invoice MONTH --csv`); in Chinese too.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::{assert_translated, login};

async fn billing_page_shows_what_the_api_says(backend: Backend) {
    // The manual clock starts on 2026-03-01 12:00 UTC.
    let mut app = TestApp::with(backend).with_manual_clock().start().await;
    let hank = app.user("hank", "host", "0").await;
    app.add_node_owned(&hank.client, "hank-box", "1xRTX4090")
        .await;
    let tess = app.tenant("tess", "100").await;
    let (status, r) = tess
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 5}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&tess.client, &id, "running").await;
    app.advance(Duration::seconds(61));
    app.maintenance_tick().await;
    app.advance(Duration::seconds(60));
    app.maintenance_tick().await;
    tess.client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    let done = app.wait_status(&tess.client, &id, "stopped").await;
    let charged = done["charged"].as_str().unwrap().to_owned();
    assert_ne!(charged, "0.00");

    let console = login(&app, &tess, "tess").await;
    let page = console.get("/billing").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    let (_, balance) = tess.client.get("/api/v1/balance").await;
    for field in ["balance", "held"] {
        page.assert_has(&format!(
            "data-field=\"{field}\"><span class=\"money\">{} USD</span>",
            balance[field].as_str().unwrap()
        ));
    }
    // Usage: the last 30 days by default, today's bar and row, and the instance's charge
    // linking to it.
    let (_, usage) = tess
        .client
        .get("/api/v1/usage?from=2026-01-31&to=2026-03-02")
        .await;
    assert_eq!(usage["total"], json!(charged), "{usage}");
    page.assert_has("value=\"2026-01-31\"");
    page.assert_has("value=\"2026-03-01\"");
    page.assert_has(&format!(
        "data-field=\"usage-total\"><span class=\"money\">{charged} USD</span>"
    ));
    page.assert_has("<svg");
    page.assert_has(&format!("<title>2026-03-01: {charged} USD</title>"));
    assert_eq!(page.html.matches("<rect class=\"bar\"").count(), 30);
    page.assert_has(&format!(
        "<tr data-date=\"2026-03-01\"><th scope=\"row\">2026-03-01</th><td><span class=\"money\">{charged} USD</span>"
    ));
    page.assert_has(&format!(
        "<tr data-reservation-id=\"{id}\"><th scope=\"row\"><a href=\"/instances/{id}\">"
    ));
    // The month's invoice (this month by default) with its total, and its CSV.
    let (_, invoice) = tess.client.get("/api/v1/invoices/2026-03").await;
    assert_eq!(invoice["total"], json!(charged), "{invoice}");
    page.assert_has("name=\"month\" type=\"month\" value=\"2026-03\"");
    page.assert_has(invoice["number"].as_str().unwrap());
    page.assert_has(&format!(
        "data-field=\"invoice-total\"><span class=\"money\">{charged} USD</span>"
    ));
    page.assert_has("href=\"/billing/invoice.csv?month=2026-03\"");
    let csv = console.get("/billing/invoice.csv?month=2026-03").await;
    assert_eq!(csv.status, StatusCode::OK, "{}", csv.html);
    assert!(
        csv.header("content-disposition").starts_with("attachment"),
        "{:?}",
        csv.headers
    );
    assert!(csv.header("content-type").starts_with("text/csv"));
    let (_, api_csv, _) = tess
        .client
        .get_text("/api/v1/invoices/2026-03?format=csv", "content-type")
        .await;
    assert_eq!(csv.html, api_csv, "the console's CSV is the API's");
    assert!(csv.html.contains(&format!(",{id},")), "{}", csv.html);

    // Another range and month; what cannot be used is said, and the page still stands.
    let other = console
        .get("/billing?from=2026-02-01&to=2026-02-10&month=2026-02")
        .await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.html.matches("<rect class=\"bar\"").count(), 10);
    assert!(!other.html.contains(&format!("/instances/{id}\"")));
    other.assert_has("data-field=\"invoice-total\"><span class=\"money\">0.00 USD</span>");
    let bad = console.get("/billing?from=March&month=2026-13").await;
    assert_eq!(bad.status, StatusCode::OK);
    bad.assert_has("from: &quot;March&quot; is not a date");
    bad.assert_has("role=\"alert\"");
    assert!(bad.html.contains("2026-13"), "{}", bad.html);
    let bad_csv = console.get("/billing/invoice.csv?month=2026-13").await;
    assert_eq!(bad_csv.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Not logged in: the login page, and nothing of the CSV.
    let anonymous = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = anonymous
        .get(format!("{}/billing/invoice.csv?month=2026-03", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);

    assert_translated(&console.get("/billing?lang=zh-CN").await);
    // A host sees what its nodes earned.
    let host = login(&app, &hank, "hank").await;
    let (_, hank_balance) = hank.client.get("/api/v1/balance").await;
    let earned = host.get("/billing").await;
    earned.assert_has(&format!(
        "data-field=\"earnings\"><span class=\"money\">{} USD</span>",
        hank_balance["earnings"].as_str().unwrap()
    ));
    assert_translated(&host.get("/billing?lang=zh-CN").await);
    app.shutdown().await;
}
both_stores!(billing_page, billing_page_shows_what_the_api_says);
