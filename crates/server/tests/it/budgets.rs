//! Monthly budgets through the API, on both stores, with a real agent: a budget set mid-month
//! counts what was spent, its thresholds fire once each however many passes (and replicas)
//! see them, new reservations get 402 `budget_exceeded` at the limit, `stop_at_limit` stops
//! running work but never a reserved block, and a team's budget is set by its admins only.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

fn alerts(status: &Value) -> Vec<String> {
    status["alerts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["alert"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn a_budget_alerts_once_refuses_at_its_limit_and_stops_when_asked(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("4xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let rita = app.tenant("rita", "1000").await;
    let (status, none) = rita.client.get("/api/v1/budget").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{none}");

    // Bad budgets say why.
    for (body, why) in [
        (json!({"monthly": "0"}), "more than zero"),
        (json!({"monthly": "10", "alert_at": [0]}), "percentages"),
        (
            json!({"monthly": "10", "low_balance_hours": 745}),
            "at most",
        ),
    ] {
        let (status, _, bad) = rita.client.send("PUT", "/api/v1/budget", Some(&body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert!(bad.to_string().contains(why), "{bad}");
    }

    // A reserved block (24 h at 2.00, prepaid) and an on-demand GPU at 2.50/h, two hours.
    let (status, block) = rita
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 24, "tier": "reserved"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{block}");
    let (status, od) = rita
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 10}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{od}");
    let (block, od) = (
        block["id"].as_str().unwrap().to_owned(),
        od["id"].as_str().unwrap().to_owned(),
    );
    app.wait_status(&rita.client, &od, "running").await;
    app.wait_status(&rita.client, &block, "running").await;
    app.advance(Duration::hours(2));
    app.maintenance_tick().await;

    // Set mid-month below what was spent (2 h × 4.50 = 9.00): over at once, every threshold
    // reached fired once.
    let (status, _, set) = rita
        .client
        .send(
            "PUT",
            "/api/v1/budget",
            Some(&json!({"monthly": "8", "alert_at": [50, 100, 200]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["spent"], "9.00", "{set}");
    assert_eq!(set["burn_per_hour"], "4.50", "{set}");
    assert_eq!(set["over"], true, "{set}");
    assert_eq!(alerts(&set), ["50", "100"], "{set}");
    assert_eq!(set["month"], "2026-03");
    // The forecast: 9.00 plus 4.50/h for what is left of March (from 14:00 on the 1st).
    let left_s: i64 = (30 * 24 + 10) * 3600;
    let forecast = 9_000_000 + (4_500_000 * left_s + 3599) / 3600;
    assert_eq!(
        set["forecast"]
            .as_str()
            .unwrap()
            .parse::<gpurent_types::Money>()
            .unwrap()
            .micros(),
        forecast,
        "{set}"
    );

    let (status, refused) = rita
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{refused}");
    assert_eq!(refused["error"]["code"], "budget_exceeded", "{refused}");
    // Passes again (a second replica's would be the same): nothing fired twice; nothing
    // stopped without stop_at_limit.
    app.maintenance_tick().await;
    app.maintenance_tick().await;
    let (_, now) = rita.client.get("/api/v1/budget").await;
    assert_eq!(alerts(&now), ["50", "100"], "{now}");
    let (_, r) = rita.client.get(&format!("/api/v1/reservations/{od}")).await;
    assert_eq!(r["status"], "running", "{r}");

    // Raised: reservations are taken again.
    let (status, _, raised) = rita
        .client
        .send(
            "PUT",
            "/api/v1/budget",
            Some(&json!({"monthly": "12", "alert_at": [50, 100], "stop_at_limit": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{raised}");
    assert_eq!(raised["over"], false, "{raised}");
    // At its limit with stop_at_limit: the on-demand one stops, the paid block does not.
    app.advance(Duration::hours(1));
    app.maintenance_tick().await;
    let (_, at_limit) = rita.client.get("/api/v1/budget").await;
    assert_eq!(at_limit["over"], true, "{at_limit}");
    let stopped = app.wait_status(&rita.client, &od, "stopped").await;
    assert_eq!(stopped["end_reason"], "budget", "{stopped}");
    let (_, b) = rita
        .client
        .get(&format!("/api/v1/reservations/{block}"))
        .await;
    assert_eq!(b["status"], "running", "a reserved block is paid: {b}");

    // Removed: no budget, no refusal.
    let (status, _, _) = rita.client.send("DELETE", "/api/v1/budget", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, again) = rita
        .client
        .reserve(json!({"gpu_type": "rtx4090", "vram_gb": 1, "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    budget_limits,
    a_budget_alerts_once_refuses_at_its_limit_and_stops_when_asked
);

async fn a_teams_budget_is_its_admins_to_set_and_its_members_to_read(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let olga = app.tenant("olga", "100").await;
    let mia = app.tenant("mia", "0").await;
    let eve = app.tenant("eve", "0").await;
    let (status, _) = olga
        .client
        .post("/api/v1/teams", &json!({"name": "lab"}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = olga
        .client
        .send(
            "PUT",
            "/api/v1/teams/lab/members/mia",
            Some(&json!({"role": "member"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let body = json!({"team": "lab", "monthly": "50"});
    let (status, _, refused) = mia.client.send("PUT", "/api/v1/budget", Some(&body)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(refused.to_string().contains("admin or above"), "{refused}");
    let (status, _, _) = eve.client.send("PUT", "/api/v1/budget", Some(&body)).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "an outsider's team is unknown"
    );
    let (status, _, set) = olga.client.send("PUT", "/api/v1/budget", Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(
        (set["team"].as_str(), set["monthly"].as_str()),
        (Some("lab"), Some("50.00"))
    );
    // A token with scopes sets a team's budget (admin scope), never its maker's own, and no
    // webhook of theirs either.
    let (status, made) = olga
        .client
        .post(
            "/api/v1/tokens",
            &json!({"scopes": ["admin", "billing"], "expires_in_days": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let scoped = app.client(made["token"].as_str());
    let own = json!({"monthly": "1"});
    let (status, _, refused) = scoped.send("PUT", "/api/v1/budget", Some(&own)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(refused.to_string().contains("without scopes"), "{refused}");
    let (status, _) = scoped
        .post(
            "/api/v1/notifications",
            &json!({"url": "http://93.184.215.14/x"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = scoped.send("PUT", "/api/v1/budget", Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "the team's, with the admin scope");
    let (status, seen) = mia.client.get("/api/v1/budget?team=lab").await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["alert_at"], json!([50, 80, 100]), "{seen}");
    // Her own budget is another: she has none.
    let (status, _) = mia.client.get("/api/v1/budget").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.shutdown().await;
}
both_stores!(
    team_budgets,
    a_teams_budget_is_its_admins_to_set_and_its_members_to_read
);
