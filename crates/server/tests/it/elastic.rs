//! Elastic capacity: the maintenance loop judges the fleet (GPU allocation, the agents' CPU,
//! the queue) and calls the scale hook, a command or a webhook, once per cooldown; a hook that
//! fails is asked again while the rule holds.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpurent_sched::elastic::ElasticConfig;
use gpurent_server::ScaleConfig;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

/// Evaluated on every maintenance tick (100 ms in tests).
fn scale(command: Option<String>, url: Option<String>, policy: ElasticConfig) -> ScaleConfig {
    ScaleConfig {
        hook_command: command,
        hook_url: url,
        interval: Duration::from_millis(50),
        policy,
        ..ScaleConfig::default()
    }
}

/// A hook that appends its stdin (one JSON line) to `actions.jsonl` and its environment's
/// action to `kinds`.
fn recording_hook(dir: &Path) -> String {
    let d = dir.display();
    format!("cat >> {d}/actions.jsonl && echo \"$GPURENT_SCALE_ACTION\" >> {d}/kinds")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn actions(dir: &Path) -> Vec<Value> {
    lines(&dir.join("actions.jsonl"))
        .iter()
        .map(|l| serde_json::from_str(l).expect("one JSON action per line"))
        .collect()
}

async fn full_gpus_and_busy_cpus_scale_out_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_agent_cpu(90)
        .with_scale(scale(
            Some(recording_hook(dir.path())),
            None,
            ElasticConfig::default(),
        ))
        .start()
        .await;
    // Busy CPUs alone are not enough, nor is one node at min_nodes idle.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(actions(dir.path()), Vec::<Value>::new());

    let alice = app.tenant("alice", "100").await;
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    // `kinds` is written after the action: both are there once it is.
    app.eventually("a scale-out action", || async {
        !lines(&dir.path().join("kinds")).is_empty()
    })
    .await;
    let got = actions(dir.path());
    let a = &got[0];
    assert_eq!(a["action"], "scale-out", "{a}");
    assert_eq!(a["rule"], "busy", "{a}");
    assert_eq!(
        a["reason"],
        "busy: CPU 90.0% > 70% and GPU allocation 100.0% > 85% for 3 evaluations"
    );
    assert_eq!(
        a["figures"],
        json!({
            "live_nodes": 1,
            "gpus": 2,
            "gpu_allocation_pct": 100.0,
            "gpu_utilization_pct": 0.0,
            "cpu_utilization_pct": 90.0,
            "queued": 0,
            "oldest_queued_s": null
        })
    );
    assert!(a["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{a}");
    assert_eq!(lines(&dir.path().join("kinds")), vec!["scale-out"]);

    // Within the cooldown (5 minutes), no second one, though the rule still holds.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(actions(dir.path()).len(), 1);
    app.shutdown().await;
}
both_stores!(
    full_gpus_and_busy_cpus_scale_out_once_,
    full_gpus_and_busy_cpus_scale_out_once
);

async fn an_idle_fleet_above_min_nodes_scales_in(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_sim_gpus("1xRTX4090")
        .with_agent_cpu(5)
        .with_scale(scale(
            Some(recording_hook(dir.path())),
            None,
            ElasticConfig {
                min_nodes: 1,
                ..ElasticConfig::default()
            },
        ))
        .start()
        .await;
    // `kinds` is written after the action: both are there once it is.
    app.eventually("a scale-in action", || async {
        !lines(&dir.path().join("kinds")).is_empty()
    })
    .await;
    let a = &actions(dir.path())[0];
    assert_eq!(
        (&a["action"], &a["rule"]),
        (&json!("scale-in"), &json!("idle")),
        "{a}"
    );
    assert_eq!(a["figures"]["live_nodes"], 2, "{a}");
    assert_eq!(a["figures"]["gpu_allocation_pct"], 0.0, "{a}");
    assert_eq!(a["figures"]["cpu_utilization_pct"], 5.0, "{a}");
    assert_eq!(
        a["reason"],
        "idle: GPU allocation 0.0% < 30% and CPU 5.0% < 30% for 10 evaluations, 2 live nodes > 1"
    );
    assert_eq!(lines(&dir.path().join("kinds")), vec!["scale-in"]);
    app.shutdown().await;
}
both_stores!(
    an_idle_fleet_above_min_nodes_scales_in_,
    an_idle_fleet_above_min_nodes_scales_in
);

/// A failing command is run again at the next evaluation while the rule holds, and no more
/// once it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hook_is_retried_while_the_rule_holds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let app = TestApp::with(Backend::Sqlite)
        .with_sim_gpus("1xRTX4090")
        .with_agent_cpu(95)
        .with_scale(scale(
            Some(format!(
                "cat >> {d}/actions.jsonl; [ -e {d}/ok ] && touch {d}/delivered"
            )),
            None,
            ElasticConfig {
                out_window: 1,
                ..ElasticConfig::default()
            },
        ))
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    app.eventually("the hook to be tried twice", || async {
        actions(dir.path()).len() >= 2
    })
    .await;
    std::fs::write(dir.path().join("ok"), "").unwrap();
    app.eventually("the hook to succeed", || async {
        dir.path().join("delivered").exists()
    })
    .await;
    let tries = actions(dir.path()).len();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        actions(dir.path()).len(),
        tries,
        "asked again in the cooldown"
    );
    assert!(actions(dir.path()).iter().all(|a| a["rule"] == "busy"));
    app.shutdown().await;
}

/// The webhook: a reservation queued longer than the limit asks for a node.
async fn a_long_queue_posts_to_the_webhook(backend: Backend) {
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let router = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let got = got.clone();
            move |axum::Json(v): axum::Json<Value>| async move {
                got.lock().unwrap().push(v);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });

    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_agent_cpu(10)
        .with_scale(scale(
            None,
            Some(url),
            ElasticConfig {
                queue_wait_s: 0,
                ..ElasticConfig::default()
            },
        ))
        .start()
        .await;
    let alice = app.tenant("alice", "100").await;
    let bob = app.tenant("bob", "100").await;
    let one = json!({"gpu_type": "rtx4090", "hours": 1});
    let (status, r) = alice.client.reserve(one.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let mut queued = one;
    queued["queue"] = json!(true);
    let (status, r) = bob.client.reserve(queued).await;
    assert!(status.is_success(), "{status} {r}");
    assert_eq!(r["status"], "pending", "{r}");
    app.eventually("a webhook call", || async {
        !got.lock().unwrap().is_empty()
    })
    .await;
    let a = got.lock().unwrap()[0].clone();
    assert_eq!(
        (&a["action"], &a["rule"]),
        (&json!("scale-out"), &json!("queue_wait")),
        "{a}"
    );
    assert_eq!(a["figures"]["queued"], 1, "{a}");
    assert!(
        a["figures"]["oldest_queued_s"]
            .as_u64()
            .is_some_and(|s| s >= 1),
        "{a}"
    );
    assert_eq!(a["figures"]["gpu_allocation_pct"], 100.0, "{a}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(got.lock().unwrap().len(), 1, "one per cooldown");
    app.shutdown().await;
}
both_stores!(
    a_long_queue_posts_to_the_webhook_,
    a_long_queue_posts_to_the_webhook
);
