//! Price tiers end to end: the first hour held and released, host earnings per node, prepaid
//! reserved blocks, the stepped tier's step, spot bids and preemption, invoices.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

async fn balance(client: &Client) -> (String, String, String) {
    let (_, b) = client.get("/api/v1/balance").await;
    let s = |k: &str| b[k].as_str().unwrap_or_default().to_owned();
    (s("balance"), s("held"), s("earnings"))
}

fn id(r: &Value) -> String {
    r["id"].as_str().expect("id").to_owned()
}

async fn holds_and_host_earnings(backend: Backend) {
    let mut app = TestApp::with(backend).with_manual_clock().start().await;
    let hank = app.user("hank", "host", "0").await;
    app.add_node_owned(&hank.client, "hank-box", "1xRTX4090")
        .await;
    let (_, nodes) = hank.client.get("/api/v1/nodes").await;
    assert_eq!(nodes[0]["owner_id"], json!(hank.id), "{nodes}");
    let t = app.tenant("tess", "100").await;
    let (status, _) = t.client.get("/api/v1/nodes").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = t.client.post("/api/v1/nodes/join-token", &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // The first hour moves into the hold at once.
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 5}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = id(&r);
    assert_eq!(
        balance(&t.client).await,
        ("97.50".into(), "2.50".into(), "0.00".into())
    );
    app.wait_status(&t.client, &id, "running").await;

    // The first settlement gives it back and charges 61 s; the host earns 80% of that,
    // rounded down on the running total.
    app.advance(Duration::seconds(61));
    app.maintenance_tick().await;
    assert_eq!(
        balance(&t.client).await,
        ("99.957639".into(), "0.00".into(), "0.00".into())
    );
    assert_eq!(balance(&hank.client).await.2, "0.033888");
    app.advance(Duration::seconds(60));
    app.maintenance_tick().await;
    app.advance(Duration::seconds(10));
    t.client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    let done = app.wait_status(&t.client, &id, "stopped").await;
    assert_eq!(done["charged"], "0.090972");
    // floor(0.090972 × 0.8) = 0.072777.
    assert_eq!(balance(&hank.client).await.2, "0.072777");
    let (_, earned) = hank.client.get("/api/v1/earnings").await;
    assert_eq!(earned["total"], "0.072777", "{earned}");
    assert_eq!(earned["nodes"][0]["node"], "hank-box");
    let (_, none) = t.client.get("/api/v1/earnings").await;
    assert_eq!(none["total"], "0.00");

    // The month's invoice has the one line, as JSON and as CSV.
    let (status, invoice) = t.client.get("/api/v1/invoices/2026-03").await;
    assert_eq!(status, StatusCode::OK, "{invoice}");
    assert_eq!(invoice["total"], "0.090972");
    assert_eq!(invoice["lines"][0]["reservation_id"], json!(id));
    assert_eq!(invoice["lines"][0]["amount"], "0.090972");
    assert_eq!(invoice["lines"][0]["tier"], "on-demand");
    // The price offered, reserved at and invoiced is one figure.
    let (_, offers) = t.client.get("/api/v1/offers").await;
    assert_eq!(offers[0]["price_per_hour"], "2.50");
    assert_eq!(r["price_per_hour"], "2.50");
    assert_eq!(invoice["lines"][0]["price_per_hour"], "2.50");
    let number = invoice["number"].as_str().unwrap_or_default().to_owned();
    assert!(number.starts_with("GR-202603-"), "{number}");
    let (status, csv, _) = t
        .client
        .get_text("/api/v1/invoices/2026-03?format=csv", "content-type")
        .await;
    assert_eq!(status, StatusCode::OK);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 3, "{csv}");
    assert!(rows[0].starts_with("invoice,month,reservation_id,gpu_type"));
    assert!(
        rows[1].contains(&id) && rows[1].ends_with(",0.090972,USD,,,,"),
        "{csv}"
    );
    assert!(
        rows[2].contains(",total,") && rows[2].ends_with(",0.090972,USD,,,,"),
        "{csv}"
    );
    let (_, april) = t.client.get("/api/v1/invoices/2026-04").await;
    assert_eq!(
        (
            april["total"].as_str(),
            april["lines"].as_array().map(Vec::len)
        ),
        (Some("0.00"), Some(0))
    );
    for bad in ["2026-13", "2026-3", "march", "2026-03-01"] {
        let (status, body) = t.client.get(&format!("/api/v1/invoices/{bad}")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
    }
    let (status, _) = t
        .client
        .get(&format!("/api/v1/invoices/2026-03?user_id={}", hank.id))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(holds_and_earnings, holds_and_host_earnings);

async fn reserved_blocks_and_the_stepped_tier(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    // 24 h at 2.50 less 20% is a block of 48.00, prepaid into the hold.
    let poor = app.tenant("poor", "40").await;
    let (status, r) = poor
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 24, "tier": "reserved"}))
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{r}");
    assert_eq!(balance(&poor.client).await.0, "40.00");

    let t = app.tenant("rita", "1050").await;
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 24, "tier": "reserved"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(
        (r["tier"].as_str(), r["price_per_hour"].as_str()),
        (Some("reserved"), Some("2.00"))
    );
    let block = id(&r);
    assert_eq!(r["held"], "48.00");
    assert_eq!(
        balance(&t.client).await,
        ("1002.00".into(), "48.00".into(), "0.00".into())
    );

    // The stepped tier: the on-demand 2.50 for 3 hours, then 60% of it, 1.50.
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 10, "tier": "stepped"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["price_per_hour"], "2.50");
    let stepped = id(&r);
    assert_eq!(balance(&t.client).await.1, "50.50");
    app.wait_status(&t.client, &block, "running").await;
    app.wait_status(&t.client, &stepped, "running").await;

    // Four hours in one settlement: the block is paid from its hold, the stepped one costs
    // 3 × 2.50 + 1.50.
    app.advance(Duration::hours(4));
    app.maintenance_tick().await;
    let (_, r) = t.client.get(&format!("/api/v1/reservations/{block}")).await;
    assert_eq!(r["charged"], "8.00");
    let (_, r) = t
        .client
        .get(&format!("/api/v1/reservations/{stepped}"))
        .await;
    assert_eq!(r["charged"], "9.00");
    // 1050 - 48 (block) - 9.00; the block's hold is down to 40.00.
    assert_eq!(
        balance(&t.client).await,
        ("993.00".into(), "40.00".into(), "0.00".into())
    );

    // Stopping a block early forfeits it; the stepped one pays its half hour at 1.50/h.
    app.advance(Duration::minutes(30));
    for r in [&block, &stepped] {
        t.client
            .post(&format!("/api/v1/reservations/{r}/stop"), &json!({}))
            .await;
    }
    let done = app.wait_status(&t.client, &block, "stopped").await;
    assert_eq!(done["charged"], "48.00");
    let done = app.wait_status(&t.client, &stepped, "stopped").await;
    assert_eq!(done["charged"], "9.75");
    assert_eq!(
        balance(&t.client).await,
        ("992.25".into(), "0.00".into(), "0.00".into())
    );
    let (_, invoice) = t.client.get("/api/v1/invoices/2026-03").await;
    assert_eq!(invoice["total"], "57.75", "{invoice}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(blocks_and_steps, reserved_blocks_and_the_stepped_tier);

async fn spot_instances_are_preempted_by_higher_bids(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let s = app.tenant("sally", "10").await;
    let o = app.tenant("otto", "10").await;
    let spot = |bid: Option<&str>| {
        let mut body = json!({"gpu_type": "rtx4090", "hours": 2, "tier": "spot"});
        if let Some(bid) = bid {
            body["bid"] = json!(bid);
        }
        body
    };
    // No bid: the lowest, 40% of 2.50.
    let (status, r) = s.client.reserve(spot(None)).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(
        (r["price_per_hour"].as_str(), r["bid"].as_str()),
        (Some("1.00"), Some("1.00"))
    );
    let first = id(&r);
    app.wait_status(&s.client, &first, "running").await;
    app.advance(Duration::seconds(100));
    app.wait_nodes_ready().await;

    // On-demand work takes the GPU; the spot instance is billed to the second it was preempted.
    let (status, r) = o
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let on_demand = id(&r);
    let done = app.wait_status(&s.client, &first, "preempted").await;
    assert_eq!(
        (done["end_reason"].as_str(), done["charged"].as_str()),
        (Some("preempted"), Some("0.027777"))
    );
    app.wait_status(&o.client, &on_demand, "running").await;
    // Spot never preempts on-demand work, whatever the bid.
    let (status, r) = s.client.reserve(spot(Some("2.50"))).await;
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("no_capacity"))
    );
    o.client
        .post(
            &format!("/api/v1/reservations/{on_demand}/stop"),
            &json!({}),
        )
        .await;
    app.wait_status(&o.client, &on_demand, "stopped").await;

    // Between spot bids the higher one wins; an equal one does not preempt.
    let (_, r) = s.client.reserve(spot(Some("1.20"))).await;
    let low = id(&r);
    app.wait_status(&s.client, &low, "running").await;
    let (status, _) = o.client.reserve(spot(Some("1.20"))).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, r) = o.client.reserve(spot(Some("2.00"))).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let high = id(&r);
    app.wait_status(&s.client, &low, "preempted").await;
    app.wait_status(&o.client, &high, "running").await;
    app.advance(Duration::seconds(36));
    o.client
        .post(&format!("/api/v1/reservations/{high}/stop"), &json!({}))
        .await;
    let done = app.wait_status(&o.client, &high, "stopped").await;
    assert_eq!(done["charged"], "0.02");

    // One of three spot instances ran to its tenant's stop.
    let (_, stats) = app.admin().get("/api/v1/admin/spot").await;
    assert_eq!(
        (&stats["ended"], &stats["preempted"], &stats["completed"]),
        (&json!(3), &json!(2), &json!(1)),
        "{stats}"
    );
    let rate = stats["success_rate"].as_f64().unwrap_or_default();
    assert!((rate - 1.0 / 3.0).abs() < 1e-9, "{stats}");
    let (status, _) = s.client.get("/api/v1/admin/spot").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(spot, spot_instances_are_preempted_by_higher_bids);

/// A preempted spot process gets SIGTERM and the spot grace before SIGKILL; its billing ends
/// at the preemption, and the work that preempted it starts only once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_process_gets_its_notice() {
    let mut app = TestApp::with(Backend::Sqlite)
        .with_prices("[spot]\ngrace_seconds = 2\n")
        .start()
        .await;
    // The executor's own default grace is long: the 2 s must come from the spot terms.
    app.add_process_node("proc", std::time::Duration::from_secs(60))
        .await;
    let s = app.tenant("sam", "10").await;
    let (status, r) = s
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "tier": "spot",
            "command": ["sh", "-c", "trap 'echo got-term' TERM; echo up; while true; do sleep 0.2; done"]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let victim = id(&r);
    app.wait_status(&s.client, &victim, "running").await;
    let o = app.tenant("olga", "10").await;
    let (status, r) = o
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "command": ["sleep", "30"]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let preemptor = id(&r);
    let done = app.wait_status(&s.client, &victim, "preempted").await;
    let running = app.wait_status(&o.client, &preemptor, "running").await;

    let (_, logs, _) = s
        .client
        .get_text(
            &format!("/api/v1/reservations/{victim}/logs"),
            "x-log-next-offset",
        )
        .await;
    assert!(logs.contains("up") && logs.contains("got-term"), "{logs:?}");
    let time = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or_default()).expect("time")
    };
    let (started, ended) = (time(&done["started_at"]), time(&done["ended_at"]));
    // Billed to the second of the preemption, at its bid of 1.00/h.
    let seconds = (ended - started).num_seconds();
    assert_eq!(
        done["charged"].as_str(),
        Some(
            gpurent_types::Money::from_micros(seconds * 1_000_000 / 3600)
                .to_string()
                .as_str()
        )
    );
    // The preemptor started after the grace, not while the victim still held the GPU.
    let waited = time(&running["started_at"]) - ended;
    assert!(
        waited >= chrono::Duration::milliseconds(1500),
        "started {waited} after the preemption"
    );
    app.assert_consistent().await;
    app.shutdown().await;
}
