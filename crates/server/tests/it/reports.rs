//! Usage reports from a seeded day: alice's two GPUs 12:00-13:30, bob's spot GPU preempted
//! after 30 minutes by carol's two GPUs 14:00-15:00; every figure checked against the hand
//! computation, and the reports are for admins only.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

fn id(r: &Value) -> String {
    r["id"].as_str().expect("id").to_owned()
}

async fn stop(app: &TestApp, client: &Client, id: &str) {
    let (status, r) = client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    app.wait_status(client, id, "stopped").await;
}

/// Runs for `minutes`, settling every half hour as the maintenance loop would.
async fn run_for(app: &TestApp, minutes: i64) {
    for _ in 0..minutes / 30 {
        app.advance(Duration::minutes(30));
        app.maintenance_tick().await;
    }
    app.wait_nodes_ready().await;
}

async fn a_seeded_day_is_reported_as_computed_by_hand(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    // 2026-03-01 12:00 UTC.
    let alice = app.tenant("alice", "100").await;
    let bob = app.tenant("bob", "100").await;
    let carol = app.tenant("carol", "100").await;
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 5}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let a = id(&r);
    app.wait_status(&alice.client, &a, "running").await;
    run_for(&app, 90).await;
    stop(&app, &alice.client, &a).await; // 13:30

    let (status, r) = bob
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 2, "tier": "spot"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["price_per_hour"], "1.00");
    let b = id(&r);
    app.wait_status(&bob.client, &b, "running").await;
    run_for(&app, 30).await;
    let (status, r) = carol
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 2}))
        .await; // 14:00: preempts bob
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let c = id(&r);
    app.wait_status(&bob.client, &b, "preempted").await;
    app.wait_status(&carol.client, &c, "running").await;
    run_for(&app, 60).await;
    stop(&app, &carol.client, &c).await; // 15:00

    let (status, day) = app
        .admin()
        .get("/api/v1/reports/daily?date=2026-03-01")
        .await;
    assert_eq!(status, StatusCode::OK, "{day}");
    // GPU-hours: alice 2 x 1.5, bob 1 x 0.5, carol 2 x 1. Revenue: 2 x 2.50 x 1.5 = 7.50,
    // 1.00 x 0.5 = 0.50, 2 x 2.50 x 1 = 5.00; the host's 80% of each.
    let totals = &day["totals"];
    assert_eq!(totals["gpus"], 2);
    assert_eq!(totals["gpu_hours"], 5.5);
    assert_eq!(totals["revenue"], "13.00");
    assert_eq!(totals["host_earnings"], "10.40");
    let tenants: Vec<(&str, f64, &str)> = day["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["tenant"].as_str().unwrap(),
                t["gpu_hours"].as_f64().unwrap(),
                t["revenue"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tenants,
        [
            ("alice", 3.0, "7.50"),
            ("bob", 0.5, "0.50"),
            ("carol", 2.0, "5.00")
        ]
    );
    // Whole GPUs count all their memory: alice's VRAM-hours are 3 h of a GPU's GB.
    let vram_mb = day["gpus"][0]["vram_mb"].as_f64().unwrap();
    let alice_vram = day["tenants"][0]["vram_gb_hours"].as_f64().unwrap();
    assert!(
        (alice_vram - 3.0 * vram_mb / 1024.0).abs() < 1e-3,
        "{alice_vram}"
    );

    // Per GPU: alice's 1.5 h and carol's 1 h on each, bob's half hour on one of them; each
    // two-GPU reservation's revenue split evenly.
    let mut gpus: Vec<(f64, String)> = day["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["gpu_hours"].as_f64().unwrap(),
                g["revenue"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    gpus.sort_by(|x, y| x.partial_cmp(y).unwrap());
    assert_eq!(gpus, [(2.5, "6.25".into()), (3.0, "6.75".into())]);
    // The simulated GPUs report 0% and no memory used, sampled from 12:00 on.
    for g in day["gpus"].as_array().unwrap() {
        let hours = g["hours"].as_array().unwrap();
        assert_eq!(hours.len(), 24);
        assert!(hours[12]["samples"].as_u64().unwrap() > 0, "{g}");
        assert_eq!(hours[12]["utilization_pct"], 0.0);
        assert_eq!(hours[12]["used_mb"], 0);
        assert_eq!(hours[12]["allocated_mb"], g["vram_mb"]); // the whole hour held
        assert_eq!(hours[11]["samples"], 0);
        assert_eq!(hours[11]["utilization_pct"], Value::Null);
    }
    let node = &day["nodes"][0];
    assert_eq!(
        (&node["gpu_hours"], &node["revenue"], &node["host_earnings"]),
        (&json!(5.5), &json!("13.00"), &json!("10.40"))
    );
    assert_eq!(node["allocation_pct"], 11.46); // 5.5 of 48 GPU-hours
    let timeline: Vec<(&str, &str, &str, &str)> = day["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["tenant"].as_str().unwrap(),
                e["status"].as_str().unwrap(),
                e["start"].as_str().unwrap(),
                e["end"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        timeline,
        [
            (
                "alice",
                "stopped",
                "2026-03-01T12:00:00Z",
                "2026-03-01T13:30:00Z"
            ),
            (
                "bob",
                "preempted",
                "2026-03-01T13:30:00Z",
                "2026-03-01T14:00:00Z"
            ),
            (
                "carol",
                "stopped",
                "2026-03-01T14:00:00Z",
                "2026-03-01T15:00:00Z"
            ),
        ]
    );

    // The week: by ISO week and by its first day alike.
    let (status, week) = app
        .admin()
        .get("/api/v1/reports/weekly?week=2026-W09")
        .await;
    assert_eq!(status, StatusCode::OK, "{week}");
    assert_eq!(week["from"], "2026-02-23T00:00:00Z");
    let (_, same) = app
        .admin()
        .get("/api/v1/reports/weekly?from=2026-02-23")
        .await;
    assert_eq!(same["tiers"], week["tiers"]);
    let tier = |name: &str| {
        week["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tier"] == name)
            .unwrap()
            .clone()
    };
    let od = tier("on-demand");
    assert_eq!(
        (
            &od["gpu_hours"],
            &od["charged"],
            &od["price_per_gpu_hour"],
            &od["preemptions"]
        ),
        (&json!(5.0), &json!("12.50"), &json!("2.50"), &json!(0))
    );
    assert_eq!(
        (&od["host_earnings"], &od["platform_return"]),
        (&json!("10.00"), &json!("2.50"))
    );
    let spot = tier("spot");
    assert_eq!(
        (
            &spot["gpu_hours"],
            &spot["charged"],
            &spot["price_per_gpu_hour"],
            &spot["preemptions"]
        ),
        (&json!(0.5), &json!("0.50"), &json!("1.00"), &json!(1))
    );
    assert_eq!(tier("reserved")["reservations"], 0);
    assert_eq!(week["total"]["platform_return"], "2.60");

    // Nothing the next day; bad dates are 422 naming the field; tenants may not look.
    let (_, next) = app
        .admin()
        .get("/api/v1/reports/daily?date=2026-03-02")
        .await;
    assert_eq!(next["totals"]["revenue"], "0.00");
    assert_eq!(next["timeline"], json!([]));
    for (path, field) in [
        ("/api/v1/reports/daily?date=2026-02-30", "date"),
        ("/api/v1/reports/daily", "date"),
        ("/api/v1/reports/weekly?week=2026-W60", "week"),
        ("/api/v1/reports/weekly?from=March", "from"),
    ] {
        let (status, e) = app.admin().get(path).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{path}: {message}");
    }
    let (status, _) = alice
        .client
        .get("/api/v1/reports/daily?date=2026-03-01")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(seeded_day, a_seeded_day_is_reported_as_computed_by_hand);

/// A team's reservations are its own row, marked a team, with what each member made for it.
async fn a_teams_day_names_its_members(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let olga = app.tenant("olga", "100").await;
    let arty = app.tenant("arty", "10").await;
    app.team(&olga.client, "lab", &[("arty", "member")], "50")
        .await;
    let mut ids = Vec::new();
    for who in [&olga, &arty] {
        let (status, r) = who
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 2, "team": "lab"}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        app.wait_status(&who.client, &id(&r), "running").await;
        ids.push(id(&r));
    }
    run_for(&app, 60).await;
    for i in &ids {
        stop(&app, &olga.client, i).await;
    }
    let (status, day) = app
        .admin()
        .get("/api/v1/reports/daily?date=2026-03-01")
        .await;
    assert_eq!(status, StatusCode::OK, "{day}");
    let tenants = day["tenants"].as_array().unwrap();
    assert_eq!(
        tenants.len(),
        1,
        "members' work for the team is the team's: {day}"
    );
    let lab = &tenants[0];
    assert_eq!(
        (lab["tenant"].as_str(), lab["team"].as_bool()),
        (Some("lab"), Some(true))
    );
    let members: Vec<(&str, u64, f64, &str)> = lab["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["member"].as_str().unwrap(),
                m["reservations"].as_u64().unwrap(),
                m["gpu_hours"].as_f64().unwrap(),
                m["revenue"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        members,
        [("arty", 1, 1.0, "2.50"), ("olga", 1, 1.0, "2.50")]
    );
    let made_by: Vec<&str> = day["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["made_by"].as_str())
        .collect();
    assert_eq!(made_by.len(), 2, "{day}");
    app.shutdown().await;
}
both_stores!(team_day, a_teams_day_names_its_members);
