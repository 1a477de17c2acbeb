//! The contract flow: reserve, run, stop or expire, and the exact per-second charge.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn reserve_run_stop_is_charged_to_the_second(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;

    let (status, offers) = alice.client.get("/api/v1/offers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        offers,
        json!([{"gpu_type": "RTX4090", "vram_gb": 24, "vram_mb": 24564, "available": 2,
            "price_per_hour": "2.50", "spot_min_bid": "1.00", "stepped_price_per_hour": "2.50",
            "stepped_first_hours": 3, "stepped_then_per_hour": "1.50",
            "share_price_per_gb_hour": "0.104218", "currency": "USD",
            "reserved_discounts": [{"min_hours": 24, "percent": 20, "price_per_hour": "2.00"},
                {"min_hours": 168, "percent": 30, "price_per_hour": "1.75"},
                {"min_hours": 720, "percent": 40, "price_per_hour": "1.50"}]}])
    );

    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "RTX 4090", "hours": 2, "command": ["python", "train.py"]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(
        (
            r["gpu_type"].as_str(),
            r["gpu_count"].as_u64(),
            r["price_per_hour"].as_str(),
            r["tier"].as_str()
        ),
        (Some("RTX4090"), Some(1), Some("2.50"), Some("on-demand"))
    );
    let id = r["id"].as_str().expect("id").to_owned();
    let running = app.wait_status(&alice.client, &id, "running").await;
    assert_eq!(running["node"], "node-0");
    assert_eq!(running["gpus"].as_array().map(Vec::len), Some(1));
    let (_, offers) = alice.client.get("/api/v1/offers").await;
    assert_eq!(offers[0]["available"], 1);

    app.advance(Duration::seconds(90));
    let (status, stopped) = alice
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stopped, json!({"id": id, "status": "stopping"}));
    // The agent confirms later; billing still ends at the stop request.
    app.advance(Duration::seconds(30));
    let done = app.wait_status(&alice.client, &id, "stopped").await;
    assert_eq!(done["charged"], "0.0625"); // 90 s at 2.50/h
    assert_eq!(done["end_reason"], "stopped_by_user");
    let (_, balance) = alice.client.get("/api/v1/balance").await;
    assert_eq!(
        balance,
        json!({"balance": "99.9375", "currency": "USD", "held": "0.00", "earnings": "0.00"})
    );

    // Stopping again changes nothing and charges nothing.
    let (status, again) = alice
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(
        (status, again["status"].as_str()),
        (StatusCode::OK, Some("stopped"))
    );
    let (_, balance) = alice.client.get("/api/v1/balance").await;
    assert_eq!(balance["balance"], "99.9375");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(reserve_run_stop, reserve_run_stop_is_charged_to_the_second);

async fn reservations_expire_after_their_hours(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xA100-80GB")
        .with_manual_clock()
        .start()
        .await;
    let bob = app.tenant("bob", "10").await;
    let (status, r) = bob
        .client
        .reserve(json!({"gpu_type": "a100-80gb", "hours": 0.5}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().expect("id").to_owned();
    app.wait_status(&bob.client, &id, "running").await;

    app.advance(Duration::minutes(29));
    app.maintenance_tick().await;
    let (_, still) = bob.client.get(&format!("/api/v1/reservations/{id}")).await;
    assert_eq!(still["status"], "running");

    // Noticed late, but billed exactly 30 minutes.
    app.advance(Duration::minutes(5));
    app.maintenance_tick().await;
    let done = app.wait_status(&bob.client, &id, "expired").await;
    assert_eq!(done["charged"], "2.00"); // half an hour at 4.00/h
    assert_eq!(done["end_reason"], "expired");
    let (_, offers) = bob.client.get("/api/v1/offers").await;
    assert_eq!(offers[0]["available"], 1);
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(expiry, reservations_expire_after_their_hours);

async fn a_workload_that_exits_frees_its_gpu(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let carol = app.tenant("carol", "10").await;
    let (_, ok) = carol
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "0"]}))
        .await;
    let done = app
        .wait_status(&carol.client, ok["id"].as_str().expect("id"), "stopped")
        .await;
    assert_eq!(done["end_reason"], "exited");
    let (_, bad) = carol
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "3"]}))
        .await;
    let failed = app
        .wait_status(&carol.client, bad["id"].as_str().expect("id"), "failed")
        .await;
    assert_eq!(failed["end_reason"], "exited_with_error");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(exits, a_workload_that_exits_frees_its_gpu);

async fn a_stop_after_the_hours_is_their_expiry(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let dan = app.tenant("dan", "10").await;
    let (_, r) = dan
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    let id = r["id"].as_str().expect("id").to_owned();
    app.wait_status(&dan.client, &id, "running").await;
    // The expiry pass has not run yet when the tenant stops it 10 minutes late.
    app.advance(Duration::minutes(70));
    let (status, _) = dan
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let done = app.wait_status(&dan.client, &id, "expired").await;
    assert_eq!(done["charged"], "2.50"); // the hour, not 70 minutes
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(late_stop, a_stop_after_the_hours_is_their_expiry);
