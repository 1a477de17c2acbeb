//! Managed jobs (`--restart`) through a real server and sim agent: failed runs started again
//! after their back-off until `max_restarts`, a preempted spot job queued again with the same id
//! and billed only for the seconds it ran, and the bad inputs refused.

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;
use crate::console_support::{field_value, login};

fn id(r: &Value) -> String {
    r["id"].as_str().expect("id").to_owned()
}

async fn get(client: &Client, id: &str) -> Value {
    client.get(&format!("/api/v1/reservations/{id}")).await.1
}

/// Waits until the job has had `n` restarts and waits in the queue again.
async fn wait_restarts(app: &TestApp, client: &Client, id: &str, n: usize) -> Value {
    app.eventually(&format!("restart {n}"), || async {
        let r = get(client, id).await;
        r["restarts"].as_array().map_or(0, Vec::len) == n && r["status"] == "pending"
    })
    .await;
    get(client, id).await
}

async fn failed_runs_restart_after_a_back_off_until_the_bound(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let carol = app.tenant("carol", "10").await;
    let (status, r) = carol
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "3"],
            "restart": "on-failure", "max_restarts": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(
        (r["restart"].as_str(), r["max_restarts"].as_u64()),
        (Some("on-failure"), Some(2))
    );
    let job = id(&r);

    // The first failure: back to the queue with the next epoch, placed no sooner than 5 s on.
    let r = wait_restarts(&app, &carol.client, &job, 1).await;
    assert_eq!(r["epoch"], 2, "{r}");
    assert_eq!(r["restarts"][0]["cause"], "exited_with_error", "{r}");
    assert_eq!(r["restarts"][0]["counted"], true, "{r}");
    assert_eq!(r["restarts"][0]["epoch"], 1, "{r}");
    assert!(r["node"].is_null(), "{r}");
    assert!(
        r["queue_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("back-off"),
        "{r}"
    );
    let retry_at = r["retry_at"].as_str().expect("retry_at").to_owned();
    let at = r["restarts"][0]["at"].as_str().expect("at");
    let gap = chrono::DateTime::parse_from_rfc3339(&retry_at).expect("time")
        - chrono::DateTime::parse_from_rfc3339(at).expect("time");
    assert_eq!(gap, Duration::seconds(5), "{r}");
    // Not placed before its back-off, however many passes.
    for _ in 0..3 {
        app.maintenance_tick().await;
    }
    let still = get(&carol.client, &job).await;
    assert_eq!(
        (still["status"].as_str(), still["epoch"].as_i64()),
        (Some("pending"), Some(2)),
        "{still}"
    );

    // After it: run again, failed again, and the next wait is twice as long.
    app.advance(Duration::seconds(5));
    app.maintenance_tick().await;
    let r = wait_restarts(&app, &carol.client, &job, 2).await;
    assert_eq!(r["epoch"], 3, "{r}");
    let gap = chrono::DateTime::parse_from_rfc3339(r["retry_at"].as_str().expect("retry_at"))
        .expect("time")
        - chrono::DateTime::parse_from_rfc3339(r["restarts"][1]["at"].as_str().expect("at"))
            .expect("time");
    assert_eq!(gap, Duration::seconds(10), "{r}");

    // The third failure of a job allowed two restarts is its end, with that failure's reason.
    app.advance(Duration::seconds(10));
    app.maintenance_tick().await;
    let done = app.wait_status(&carol.client, &job, "failed").await;
    assert_eq!(done["end_reason"], "exited_with_error", "{done}");
    assert_eq!(done["epoch"], 3, "{done}");
    assert_eq!(done["restarts"].as_array().map(Vec::len), Some(2), "{done}");
    assert_eq!(done["charged"], "0.00", "{done}");
    assert!(
        done.get("retry_at").is_none(),
        "only while it waits: {done}"
    );

    // `always` also runs a job that exited 0 again, within its bound.
    let (status, r) = carol
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "0"],
            "restart": "always", "max_restarts": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let again = id(&r);
    let r = wait_restarts(&app, &carol.client, &again, 1).await;
    assert_eq!(r["restarts"][0]["cause"], "exited", "{r}");
    app.advance(Duration::seconds(5));
    app.maintenance_tick().await;
    let done = app.wait_status(&carol.client, &again, "stopped").await;
    assert_eq!(done["end_reason"], "exited", "{done}");

    // `on-interruption` leaves a failure as it is.
    let (_, r) = carol
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "4"],
            "restart": "on-interruption"}),
        )
        .await;
    let done = app.wait_status(&carol.client, &id(&r), "failed").await;
    assert!(done.get("restarts").is_none(), "{done}");

    // The console's form makes one too.
    let console = login(&app, &carol, "carol").await;
    let offers = console.get("/offers").await;
    let key = field_value(&offers.html, "idempotency_key").expect("key");
    let made = console
        .post(
            "/offers",
            &[
                ("gpu_type", "RTX 4090"),
                ("hours", "1"),
                ("command", "exit 5"),
                ("restart", "on-failure"),
                ("max_restarts", "2"),
                ("idempotency_key", key.as_str()),
            ],
        )
        .await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.html);
    let job = made
        .location()
        .expect("to its page")
        .trim_start_matches("/instances/")
        .to_owned();
    let r = get(&carol.client, &job).await;
    assert_eq!(
        (r["restart"].as_str(), r["max_restarts"].as_u64()),
        (Some("on-failure"), Some(2)),
        "{r}"
    );
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    back_off,
    failed_runs_restart_after_a_back_off_until_the_bound
);

async fn a_preempted_spot_job_runs_again_billed_for_its_seconds(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let s = app.tenant("sally", "10").await;
    let o = app.tenant("otto", "20").await;
    let (status, r) = s
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 2, "tier": "spot",
            "restart": "on-interruption"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let job = id(&r);
    app.wait_status(&s.client, &job, "running").await;
    app.advance(Duration::seconds(100));
    app.wait_nodes_ready().await;

    // On-demand work takes the GPU: the job is queued again, spot still, billed its 100 s.
    let (status, r) = o
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 3}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let on_demand = id(&r);
    let r = wait_restarts(&app, &s.client, &job, 1).await;
    assert_eq!(r["restarts"][0]["cause"], "preempted", "{r}");
    assert_eq!(r["restarts"][0]["counted"], false, "{r}");
    assert_eq!(r["restarts"][0]["node"], "node-0", "{r}");
    assert_eq!(
        (r["tier"].as_str(), r["epoch"].as_i64()),
        (Some("spot"), Some(2)),
        "{r}"
    );
    assert_eq!(r["charged"], "0.027777", "{r}");
    assert!(
        r.get("retry_at").is_none(),
        "an interruption waits for no back-off: {r}"
    );
    // Its console page lists the restart.
    let console = login(&app, &s, "sally").await;
    let page = console.get(&format!("/instances/{job}")).await;
    let listed = page
        .html
        .split("data-field=\"restarts\"")
        .nth(1)
        .unwrap_or_default();
    assert!(
        listed.contains("on-interruption</code> · 1<")
            && listed.contains("run 1: <code translate=\"no\">preempted</code> · "),
        "{}",
        page.html
    );
    app.wait_status(&o.client, &on_demand, "running").await;

    // Waiting is free: an hour in the queue charges nothing.
    app.advance(Duration::hours(1));
    app.maintenance_tick().await;
    assert_eq!(get(&s.client, &job).await["charged"], "0.027777");

    // The GPU free again, the job runs again under the same id and goes on being billed from
    // where it stopped.
    o.client
        .post(
            &format!("/api/v1/reservations/{on_demand}/stop"),
            &json!({}),
        )
        .await;
    app.wait_status(&o.client, &on_demand, "stopped").await;
    app.maintenance_tick().await;
    app.wait_status(&s.client, &job, "running").await;
    app.advance(Duration::seconds(80));
    s.client
        .post(&format!("/api/v1/reservations/{job}/stop"), &json!({}))
        .await;
    let done = app.wait_status(&s.client, &job, "stopped").await;
    // 180 s at 1.00/h.
    assert_eq!(done["charged"], "0.05", "{done}");
    assert_eq!(done["end_reason"], "stopped_by_user", "{done}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    preempted,
    a_preempted_spot_job_runs_again_billed_for_its_seconds
);

async fn bad_managed_jobs_say_why(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let t = app.tenant("tina", "10").await;
    let base = json!({"gpu_type": "rtx4090", "hours": 1});
    for (extra, why) in [
        (json!({"restart": "sometimes"}), "restart"),
        (
            json!({"max_restarts": 2}),
            "max_restarts: bounds the restarts of failed runs",
        ),
        (
            json!({"restart": "on-interruption", "max_restarts": 2}),
            "which restart on-interruption does not make",
        ),
        (
            json!({"restart": "on-failure", "max_restarts": 101}),
            "at most 100",
        ),
        (
            json!({"restart": "always", "on_node_loss": "stop"}),
            "on_node_loss: stop ends the job",
        ),
        (
            json!({"restart": "on-failure", "checkpoint_volume": "ck", "checkpoint": true}),
            "not both",
        ),
        (
            json!({"checkpoint_volume": "../etc"}),
            "is not a volume's name",
        ),
        (
            json!({"checkpoint_volume": "ck", "volumes": [{"volume": "ck", "path": "/checkpoint"}]}),
            "where the checkpoint volume goes",
        ),
    ] {
        let mut body = base.clone();
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (status, bad) = t.client.reserve(body).await;
        assert!(
            status == StatusCode::UNPROCESSABLE_ENTITY || status == StatusCode::BAD_REQUEST,
            "{extra}: {status} {bad}"
        );
        assert!(bad.to_string().contains(why), "{extra}: {bad}");
    }
    // A checkpoint volume that does not exist is named.
    let mut body = base.clone();
    body["checkpoint_volume"] = json!("nowhere");
    body["restart"] = json!("on-interruption");
    let (status, bad) = t.client.reserve(body).await;
    assert!(status.is_client_error(), "{status} {bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("checkpoint_volume: you have no volume \"nowhere\"")),
        "{bad}"
    );
    app.shutdown().await;
}
both_stores!(bad_input, bad_managed_jobs_say_why);
