//! Periodic settlement: running reservations are charged every period, exactly once however
//! often settlement runs, the final charge is the exact remainder, and a tenant who cannot pay
//! for the next period is stopped.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn charged(app: &TestApp, client: &crate::app::Client, id: &str) -> String {
    let _ = app;
    let (_, r) = client.get(&format!("/api/v1/reservations/{id}")).await;
    r["charged"].as_str().unwrap_or_default().to_owned()
}

async fn running_reservations_are_charged_every_period(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let t = app.tenant("meter", "100").await;
    let (_, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 5}))
        .await;
    let id = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&t.client, &id, "running").await;

    app.advance(Duration::seconds(61));
    app.maintenance_tick().await;
    app.maintenance_tick().await; // settling again changes nothing
    assert_eq!(charged(&app, &t.client, &id).await, "0.042361"); // 61 s at 2.50/h
    let (_, b) = t.client.get("/api/v1/balance").await;
    assert_eq!(b["balance"], "99.957639");

    app.advance(Duration::seconds(60));
    app.maintenance_tick().await;
    assert_eq!(charged(&app, &t.client, &id).await, "0.084027"); // 121 s

    app.advance(Duration::seconds(10));
    let (status, _) = t
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let done = app.wait_status(&t.client, &id, "stopped").await;
    assert_eq!(done["charged"], "0.090972"); // 131 s: the final settlement is the exact remainder
    let (_, b) = t.client.get("/api/v1/balance").await;
    assert_eq!(b["balance"], "99.909028");

    // The statement: the three charges add up per reservation and per day.
    let (status, usage) = t
        .client
        .get("/api/v1/usage?from=2026-03-01&to=2026-03-02")
        .await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    assert_eq!(usage["total"], "0.090972");
    assert_eq!(
        usage["reservations"],
        json!([{"reservation_id": id, "charged": "0.090972"}])
    );
    assert_eq!(
        usage["days"],
        json!([{"date": "2026-03-01", "charged": "0.090972"}])
    );
    let (_, none) = t
        .client
        .get("/api/v1/usage?from=2026-03-02&to=2026-03-03")
        .await;
    assert_eq!(none["total"], "0.00");
    let (status, _) = t.client.get("/api/v1/usage?from=yesterday").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let other = app.tenant("nosy", "1").await;
    let (status, _) = other
        .client
        .get(&format!("/api/v1/usage?user_id={}", t.id))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, by_admin) = app
        .admin()
        .get(&format!("/api/v1/usage?user_id={}", t.id))
        .await;
    assert_eq!(by_admin["total"], "0.090972");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(every_period, running_reservations_are_charged_every_period);

async fn a_tenant_out_of_credit_is_stopped(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let t = app.tenant("thrifty", "2.60").await;
    let (_, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 10}))
        .await;
    let id = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&t.client, &id, "running").await;
    let mut minutes = 0;
    loop {
        app.advance(Duration::seconds(60));
        app.maintenance_tick().await;
        minutes += 1;
        let (_, r) = t.client.get(&format!("/api/v1/reservations/{id}")).await;
        if r["status"] != "running" || minutes > 70 {
            break;
        }
    }
    // After 62 minutes the 0.016667 left cannot pay for the next minute (0.041666).
    assert_eq!(minutes, 62);
    let done = app.wait_status(&t.client, &id, "stopped").await;
    assert_eq!(done["end_reason"], "insufficient_credit");
    assert_eq!(done["charged"], "2.583333");
    let (_, b) = t.client.get("/api/v1/balance").await;
    assert_eq!(b["balance"], "0.016667");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(out_of_credit, a_tenant_out_of_credit_is_stopped);
