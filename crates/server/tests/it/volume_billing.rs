//! What volumes cost, through the API on both stores and a moved clock: charged per second of
//! their size by the maintenance loop, their own lines in usage, the invoice (JSON and CSV) and
//! the console; a volume refused to a tenant who cannot pay a day of it; and an unpaid
//! tenant's data kept for the storage grace, after which only an admin deletes it.

use chrono::Duration;
use gpurent_billing::{storage_charge, BYTES_PER_GB};
use gpurent_store::Backend;
use gpurent_types::Money;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::login;

fn micros(v: &serde_json::Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse::<Money>().ok())
        .map(Money::micros)
        .unwrap_or_else(|| panic!("not money: {v}"))
}

async fn volumes_are_billed_and_kept_through_the_grace(backend: Backend) {
    // The manual clock starts on 2026-03-01 12:00 UTC.
    let app = TestApp::with(backend)
        .with_manual_clock()
        .with_config(|c| c.storage_grace = std::time::Duration::from_secs(2 * 86_400))
        .start()
        .await;
    let (keeper, sync) = app.node_by_hand("keeper").await;
    let mut first = sync.clone();
    first["host"] = json!({"disk_free_mb": 900_000,
        "volumes": {"enforcement": "unavailable", "reason": "no volumes dir", "free_bytes": 0, "shared": true}});
    let (status, body) = keeper.post("/api/v1/agent/sync", &first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ada = app.tenant("ada", "100").await;

    let (status, v) = ada
        .client
        .post(
            "/api/v1/volumes",
            &json!({"name": "sets", "size_bytes": 100 * BYTES_PER_GB, "shared": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    // The command line's contract: size_gb and status.
    assert_eq!(
        (v["size_gb"].as_f64(), &v["status"]),
        (Some(100.0), &v["state"])
    );
    assert_eq!(v["price_per_gb_month"], "0.07");
    assert_eq!(v["charged"], "0.00");

    // Ten days later: ten days of 100 GB at 0.07 per GB-month, to the micro-unit.
    app.advance(Duration::days(10));
    app.maintenance_tick().await;
    let ten_days = storage_charge(Money::from_micros(70_000), 100 * BYTES_PER_GB, 10 * 86_400);
    let (_, got) = ada.client.get("/api/v1/volumes/sets").await;
    assert_eq!(micros(&got["charged"]), ten_days.micros(), "{got}");
    let (_, usage) = ada.client.get("/api/v1/usage?from=2026-03-01").await;
    assert_eq!(usage["volumes"][0]["name"], "sets", "{usage}");
    assert_eq!(micros(&usage["volumes"][0]["charged"]), ten_days.micros());
    assert_eq!(micros(&usage["total"]), ten_days.micros());
    let (_, invoice) = ada.client.get("/api/v1/invoices/2026-03").await;
    assert_eq!(invoice["storage"][0]["name"], "sets", "{invoice}");
    assert_eq!(micros(&invoice["total"]), ten_days.micros());
    let (_, csv, _) = ada
        .client
        .get_text("/api/v1/invoices/2026-03?format=csv", "content-type")
        .await;
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 3, "{csv}");
    assert!(
        rows[1].ends_with(&format!(
            ",{ten_days},USD,{},sets,{},0.07",
            v["id"].as_str().unwrap(),
            100 * BYTES_PER_GB
        )),
        "{csv}"
    );
    let console = login(&app, &ada, "ada").await;
    let page = console.get("/billing?month=2026-03").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    page.assert_has(&format!("data-volume-id=\"{}\"", v["id"].as_str().unwrap()));

    // A tenant who cannot pay a day of it gets none.
    let poor = app.tenant("poor", "0.01").await;
    let (status, body) = poor
        .client
        .post(
            "/api/v1/volumes",
            &json!({"name": "big", "size_bytes": 1_000 * BYTES_PER_GB, "shared": true}),
        )
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
    assert_eq!(body["error"]["code"], "insufficient_credit");

    // Bob pays for a day (2.30 for 1000 GB), not two: his data is kept, still charged, for
    // the grace.
    let bob = app.tenant("bob", "3").await;
    let (status, big) = bob
        .client
        .post(
            "/api/v1/volumes",
            &json!({"name": "big", "size_bytes": 1_000 * BYTES_PER_GB, "shared": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{big}");
    let id = big["id"].as_str().unwrap().to_owned();
    app.advance(Duration::days(1));
    app.maintenance_tick().await;
    let (_, got) = bob.client.get("/api/v1/volumes/big").await;
    assert!(got["unpaid_since"].is_null(), "{got}");
    app.advance(Duration::days(1));
    app.maintenance_tick().await;
    let (_, got) = bob.client.get("/api/v1/volumes/big").await;
    let unpaid_since = got["unpaid_since"].as_str().expect("unpaid").to_owned();
    assert!(got["deletable_after"].is_string(), "{got}");
    let admin = app.admin();
    let path = format!("/api/v1/volumes/{id}");
    let (status, _, body) = admin.send("DELETE", &path, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("storage grace ends at"),
        "{body}"
    );
    // A paying tenant's volume is never an admin's to remove.
    let (status, _, body) = admin
        .send(
            "DELETE",
            &format!("/api/v1/volumes/{}", v["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("paid up"),
        "{body}"
    );
    // Past the grace: the admin may, and the volume is charged up to then.
    app.advance(Duration::days(2));
    app.maintenance_tick().await;
    let (_, got) = bob.client.get("/api/v1/volumes/big").await;
    assert_eq!(
        got["unpaid_since"],
        unpaid_since.as_str(),
        "kept from the first time"
    );
    let (status, _, removed) = admin.send("DELETE", &path, None).await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    assert_eq!(removed["state"], "deleting");
    assert_eq!(
        micros(&removed["charged"]),
        storage_charge(Money::from_micros(70_000), 1_000 * BYTES_PER_GB, 4 * 86_400).micros()
    );
    app.assert_consistent().await;
}
both_stores!(
    volumes_are_billed_and_kept_through_the_grace,
    volumes_are_billed_and_kept_through_the_grace
);
