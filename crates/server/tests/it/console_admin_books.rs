//! The admin pages of the books, through a real login cookie: the audit trail searched and
//! verified (intact, then altered behind the server's back), its checkpoints; the daily report
//! with its heat map and timeline as SVG images and tables, the weekly tier comparison; and
//! the ledger check. Each refused to a tenant and in zh-CN without untranslated English.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;
use crate::console_admin::{assert_admin_only, assert_chinese, content_type, login_as, row};

async fn the_audit_trail_is_searched_and_verified(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    app.wait_nodes_ready().await;
    let (admin, _) = login_as(&app, "q1", "admin").await;
    let (tenant_browser, _) = login_as(&app, "q2", "tenant").await;
    let pat = app.tenant("pat", "100").await;
    let (status, r) = pat
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let rid = r["id"].as_str().unwrap().to_owned();
    let (_, _) = pat.client.get("/api/v1/balance").await;

    // By user: only pat's requests; by action on top: only the reservation.
    let (_, api) = app
        .admin()
        .get(&format!("/api/v1/audit?user={}", pat.id))
        .await;
    let records = api["records"].as_array().unwrap();
    let mine = admin.get(&format!("/admin/audit?user={}", pat.id)).await;
    assert_eq!(mine.status, StatusCode::OK, "{}", mine.html);
    assert_eq!(
        mine.html.matches("data-seq=").count(),
        records.len(),
        "{}",
        mine.html
    );
    let reserve: &Value = records
        .iter()
        .find(|r| r["action"] == "POST /api/v1/reservations")
        .expect("the reservation is recorded");
    let seq = reserve["seq"].as_u64().unwrap();
    let tr = row(&mine.html, &format!("data-seq=\"{seq}\""));
    assert!(tr.contains(&rid), "its allocation names it: {tr}");
    let only = admin
        .get(&format!(
            "/admin/audit?user={}&action=POST+%2Fapi%2Fv1%2Freservations",
            pat.id
        ))
        .await;
    assert_eq!(only.html.matches("data-seq=").count(), 1, "{}", only.html);
    assert!(
        only.html.contains(&format!("data-seq=\"{seq}\"")),
        "the one shown is the reservation's"
    );
    assert!(only.html.contains("data-field=\"filtered\""));
    // By time: a browser's datetime-local is UTC; nothing before the first record.
    let first_at = chrono::DateTime::parse_from_rfc3339(records[0]["at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let before = (first_at - Duration::seconds(1)).format("%Y-%m-%dT%H:%M:%S");
    let none = admin
        .get(&format!("/admin/audit?user={}&to={before}", pat.id))
        .await;
    assert_eq!(none.status, StatusCode::OK, "{}", none.html);
    assert_eq!(none.html.matches("data-seq=").count(), 0);
    let since = admin
        .get(&format!("/admin/audit?user={}&from={before}", pat.id))
        .await;
    assert_eq!(since.html.matches("data-seq=").count(), records.len());
    // A time the API does not take is the API's reason, on the page.
    let bad = admin.get("/admin/audit?from=yesterday").await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.html);
    assert!(bad.html.contains("role=\"alert\""));
    // Pages by the API's cursor.
    let (_, page) = app.admin().get("/api/v1/audit?limit=100").await;
    let all = admin.get("/admin/audit").await;
    assert!(
        all.html.contains("data-table=\"checkpoints\""),
        "the first append signs one"
    );
    if let Some(next) = page["next_after"].as_u64() {
        assert!(all.html.contains(&format!("after={next}")));
    }

    // Verified intact, then altered behind the server's back: the record is named.
    let verdict = admin.get("/admin/audit/verify").await;
    assert_eq!(verdict.status, StatusCode::OK, "{}", verdict.html);
    assert!(
        verdict.html.contains("data-ok=\"true\""),
        "{}",
        verdict.html
    );
    assert!(
        all.html.contains("action=\"/admin/audit/verify\""),
        "the button"
    );
    app.raw_sql(&format!(
        "UPDATE audit_log SET outcome = 200 WHERE seq = {seq}"
    ))
    .await;
    let verdict = admin.get("/admin/audit/verify").await;
    assert!(
        verdict.html.contains("data-ok=\"false\""),
        "{}",
        verdict.html
    );
    let problem = &verdict.html[verdict.html.find("data-field=\"problem\"").unwrap()..];
    assert!(problem.contains(&format!("<dd>{seq}</dd>")), "{problem}");
    assert!(problem.contains("altered"), "{problem}");

    for path in ["/admin/audit", "/admin/audit/verify"] {
        assert_admin_only(&admin, &tenant_browser, path).await;
        assert_chinese(&admin, path).await;
    }
    assert_chinese(&admin, &format!("/admin/audit?user={}&action=POST", pat.id)).await;
    app.shutdown().await;
}

both_stores!(audit_test, the_audit_trail_is_searched_and_verified);

/// Runs for `minutes`, settling every half hour as the maintenance loop would.
async fn run_for(app: &TestApp, minutes: i64) {
    for _ in 0..minutes / 30 {
        app.advance(Duration::minutes(30));
        app.maintenance_tick().await;
    }
    app.wait_nodes_ready().await;
}

async fn reports_show_the_day_its_charts_the_week_and_the_ledger(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    app.wait_nodes_ready().await;
    let (admin, _) = login_as(&app, "q1", "admin").await;
    let (tenant_browser, _) = login_as(&app, "q2", "tenant").await;
    let alice = app.tenant("alice", "100").await;
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 5}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let rid = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&alice.client, &rid, "running").await;
    run_for(&app, 90).await;
    let (status, r) = alice
        .client
        .post(&format!("/api/v1/reservations/{rid}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    app.wait_status(&alice.client, &rid, "stopped").await;

    let (_, day) = app
        .admin()
        .get("/api/v1/reports/daily?date=2026-03-01")
        .await;
    let revenue = day["totals"]["revenue"].as_str().unwrap().to_owned();
    assert_ne!(revenue, "0.00", "{day}");
    let page = admin
        .get("/admin/reports?date=2026-03-01&week=2026-W09")
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    let html = &page.html;
    assert!(html.contains("data-date=\"2026-03-01\""), "{html}");
    let totals = &html[html.find("data-field=\"totals\"").unwrap()..];
    assert!(
        totals.contains(&format!("{revenue} USD")),
        "revenue {revenue}: {totals}"
    );
    assert!(
        html.contains(&rid),
        "the timeline table names the reservation"
    );
    assert!(html.contains("data-table=\"heatmap\""));
    assert!(
        row(html, "data-tier=\"on-demand\"").contains(&revenue),
        "the week's on-demand"
    );
    for tier in ["stepped", "spot", "reserved"] {
        assert!(html.contains(&format!("data-tier=\"{tier}\"")), "{tier}");
    }

    // Both charts, drawn as `gpurent report daily` draws them, as SVG images of this page.
    for (chart, words) in [
        ("heatmap", "VRAM used per GPU and hour, 2026-03-01"),
        ("timeline", "Reservations per GPU, 2026-03-01"),
    ] {
        let src = format!("/admin/reports/{chart}.svg?date=2026-03-01");
        assert!(
            html.contains(&format!("src=\"{}\"", src.replace('&', "&amp;"))),
            "{chart}"
        );
        let svg = admin.get(&src).await;
        assert_eq!(svg.status, StatusCode::OK, "{chart}: {}", svg.html);
        assert_eq!(content_type(&svg), "image/svg+xml");
        assert!(svg.html.trim_start().starts_with("<svg"), "{chart}");
        assert!(svg.html.contains(words), "{chart}: its caption");
        assert!(svg.html.contains("node-0 #1"), "{chart}: a row per GPU");
        assert_eq!(
            tenant_browser.get(&src).await.status,
            StatusCode::FORBIDDEN,
            "{chart} as a tenant"
        );
    }
    assert!(
        admin
            .get("/admin/reports/heatmap.svg?date=March")
            .await
            .status
            == StatusCode::UNPROCESSABLE_ENTITY
    );
    let bad = admin.get("/admin/reports?date=March").await;
    assert_eq!(bad.status, StatusCode::OK, "the week is still shown");
    assert!(bad.html.contains("role=\"alert\""), "{}", bad.html);

    // Without a week asked for, the API's default (the last whole week), shown in its field.
    let (_, week) = app.admin().get("/api/v1/reports/weekly").await;
    let week = week["week"].as_str().unwrap().to_owned();
    let default = admin.get("/admin/reports?date=2026-03-01").await;
    assert!(
        default
            .html
            .contains(&format!("name=\"week\" type=\"week\" value=\"{week}\"")),
        "week {week}"
    );

    // The ledger balances.
    let ledger = admin.get("/admin/ledger").await;
    assert_eq!(ledger.status, StatusCode::OK, "{}", ledger.html);
    assert!(ledger.html.contains("data-ok=\"true\""), "{}", ledger.html);
    let (_, check) = app.admin().get("/api/v1/admin/ledger-check").await;
    assert!(ledger
        .html
        .contains(&format!("data-field=\"transfers\">{}<", check["transfers"])));

    for path in ["/admin/reports", "/admin/ledger"] {
        assert_admin_only(&admin, &tenant_browser, path).await;
    }
    assert_chinese(&admin, "/admin/reports?date=2026-03-01&week=2026-W09").await;
    assert_chinese(&admin, "/admin/ledger").await;
    app.shutdown().await;
}

both_stores!(
    reports_test,
    reports_show_the_day_its_charts_the_week_and_the_ledger
);
