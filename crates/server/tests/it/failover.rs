//! Node loss (issue 6): an agent killed with a reservation running is fenced after the node
//! TTL; billing stops at the fence time; the reservation runs again on another node with the
//! next epoch (or ends `lost`, as its tenant chose); the old node, back, stops its stale copy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpurent_agent::executor::SimExecutor;
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::Executor;
use gpurent_billing::Rate;
use gpurent_types::{Clock, Money};
use serde_json::{json, Value};

use crate::app::{other_node, TestApp};
use crate::both_stores;

/// Two nodes of one RTX 4090 each, a manual clock, and the default liveness (2 s x 3 beats).
async fn two_nodes(backend: gpurent_store::Backend) -> TestApp {
    TestApp::with(backend)
        .with_manual_clock()
        .with_liveness(Duration::from_secs(2), 3)
        .with_sim_gpus("1xRTX4090")
        .with_sim_gpus("1xRTX4090")
        .start()
        .await
}

fn now(app: &TestApp) -> DateTime<Utc> {
    app.clock.as_ref().expect("manual clock").now()
}

fn at(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .expect("a time")
        .with_timezone(&Utc)
}

/// Moves the clock one second at a time (less than the TTL), waiting each time until the
/// `live` node has synced at the new time, so that only silent nodes are fenced.
async fn step(app: &TestApp, seconds: i64, live: &str) {
    for _ in 0..seconds {
        app.advance(chrono::Duration::seconds(1));
        let t = now(app);
        app.eventually("the live node to sync", || async {
            let (_, nodes) = app.admin().get("/api/v1/nodes").await;
            nodes.as_array().is_some_and(|ns| {
                ns.iter()
                    .any(|n| n["name"] == live && at(&n["last_seen_at"]) >= t)
            })
        })
        .await;
    }
}

/// Samples every executor until stopped and records any moment at which two nodes ran the
/// same reservation with the same epoch (the fencing guarantee), or with `any_epoch`, at all.
/// The executors of the two nodes, watched (`watch_executors`) from now on.
fn watch_both(
    app: &TestApp,
    first: &str,
    other: &str,
    any_epoch: bool,
) -> (
    Arc<SimExecutor>,
    Arc<SimExecutor>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<Vec<String>>,
) {
    let (old, new) = (app.sim_executor(first), app.sim_executor(other));
    let (stop, watcher) = watch_executors(
        vec![
            (first.to_owned(), old.clone()),
            (other.to_owned(), new.clone()),
        ],
        any_epoch,
    );
    (old, new, stop, watcher)
}

fn watch_executors(
    executors: Vec<(String, Arc<SimExecutor>)>,
    any_epoch: bool,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Vec<String>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        let problems = Arc::new(Mutex::new(Vec::new()));
        while !stopped.load(Ordering::Relaxed) {
            let mut running: BTreeMap<(String, i64), Vec<String>> = BTreeMap::new();
            for (name, e) in &executors {
                for o in e.list().await.expect("list") {
                    if o.state == ObservedState::Running {
                        let epoch = if any_epoch { 0 } else { o.epoch };
                        running
                            .entry((o.reservation_id, epoch))
                            .or_default()
                            .push(name.clone());
                    }
                }
            }
            for (key, nodes) in running.into_iter().filter(|(_, n)| n.len() > 1) {
                problems
                    .lock()
                    .expect("lock")
                    .push(format!("{key:?} ran on {nodes:?} at once"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let found = problems.lock().expect("lock").clone();
        found
    });
    (stop, task)
}

async fn epochs_on(e: &SimExecutor, id: &str) -> Vec<i64> {
    e.list()
        .await
        .expect("list")
        .into_iter()
        .filter(|o| o.reservation_id == id)
        .map(|o| o.epoch)
        .collect()
}

fn charge(price_per_hour: &Value, seconds: u64) -> Money {
    let price: Money = price_per_hour
        .as_str()
        .expect("price")
        .parse()
        .expect("money");
    Rate::flat(price).charge_for_seconds(seconds)
}

async fn lost_node_work_runs_again_elsewhere(backend: gpurent_store::Backend) {
    let mut app = two_nodes(backend).await;
    let t = app.tenant("tia", "100").await;
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, 201, "{r}");
    assert_eq!(r["on_node_loss"], "reschedule");
    let id = r["id"].as_str().unwrap().to_owned();
    let r = app.wait_status(&t.client, &id, "running").await;
    assert_eq!(r["epoch"], 1);
    let t0 = at(&r["started_at"]);
    let first = r["node"].as_str().unwrap().to_owned();
    let other = other_node(&first);
    let (old, new, stop_watch, watcher) = watch_both(&app, &first, other, false);

    app.kill_agent(&first).await;
    // Six seconds of silence is the TTL: not lost yet.
    step(&app, 6, other).await;
    app.maintenance_tick().await;
    assert_eq!(app.wait_status(&t.client, &id, "running").await["epoch"], 1);
    assert_ne!(app.node_status(&first).await, "lost");
    // The seventh: fenced at t0 + 6 s, queued again and placed on the other node at once.
    step(&app, 1, other).await;
    let placed_at = now(&app);
    app.eventually("the reservation to run on the other node", || async {
        let (_, r) = t.client.get(&format!("/api/v1/reservations/{id}")).await;
        r["status"] == "running" && r["node"] == other && r["epoch"] == 2
    })
    .await;
    assert_eq!(app.node_status(&first).await, "lost");
    assert_eq!(epochs_on(&new, &id).await, vec![2]);
    let (_, r) = t.client.get(&format!("/api/v1/reservations/{id}")).await;
    // Billed for the six seconds up to the fence, not the time until it was noticed; its
    // effective start moves back by them, so its hours go on where they stopped.
    assert_eq!(r["charged"], json!(charge(&r["price_per_hour"], 6)));
    assert_eq!(
        at(&r["started_at"]),
        placed_at - chrono::Duration::seconds(6)
    );
    assert!(at(&r["started_at"]) > t0);
    app.assert_consistent().await;

    // The old agent comes back: it is told nothing of the reservation and stops its stale copy.
    assert_eq!(epochs_on(&old, &id).await, vec![1], "the dead agent's copy");
    app.restart_agent(&first).await;
    app.eventually("the stale copy to be stopped", || async {
        epochs_on(&old, &id).await.is_empty()
    })
    .await;
    app.eventually("the old node to be ready", || async {
        app.node_status(&first).await == "ready"
    })
    .await;
    for _ in 0..10 {
        let (_, r) = t.client.get(&format!("/api/v1/reservations/{id}")).await;
        assert_eq!(
            (r["status"].as_str(), r["node"].as_str()),
            (Some("running"), Some(other))
        );
        assert_eq!(r["epoch"], 2);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Four more seconds on the new node, then a stop: ten seconds billed in all, once.
    step(&app, 4, other).await;
    let (status, _) = t
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(status, 200);
    let r = app.wait_status(&t.client, &id, "stopped").await;
    assert_eq!(r["charged"], json!(charge(&r["price_per_hour"], 10)));
    stop_watch.store(true, Ordering::Relaxed);
    let problems = watcher.await.expect("watcher");
    assert!(problems.is_empty(), "{problems:?}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    lost_node_work_runs_again_elsewhere,
    lost_node_work_runs_again_elsewhere
);

async fn work_that_chose_stop_ends_lost(backend: gpurent_store::Backend) {
    let mut app = two_nodes(backend).await;
    let t = app.tenant("tia", "100").await;
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "on_node_loss": "stop"}))
        .await;
    assert_eq!(status, 201, "{r}");
    assert_eq!(r["on_node_loss"], "stop");
    let id = r["id"].as_str().unwrap().to_owned();
    let r = app.wait_status(&t.client, &id, "running").await;
    let t0 = at(&r["started_at"]);
    let first = r["node"].as_str().unwrap().to_owned();
    let other = other_node(&first);
    app.kill_agent(&first).await;
    step(&app, 8, other).await;
    let r = app.wait_status(&t.client, &id, "lost").await;
    assert_eq!(r["end_reason"], "node_lost");
    // Billed to the node's last heartbeat plus the TTL. The killed agent's last sync may have
    // been in flight and answered after the clock's first step (the control plane runs every
    // request to its end), so its last heartbeat is t0 or t0 + 1 s.
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let seen = nodes
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == first.as_str()))
        .map(|n| at(&n["last_seen_at"]))
        .expect("the lost node");
    assert!(
        seen >= t0 && seen <= t0 + chrono::Duration::seconds(1),
        "{seen} {t0}"
    );
    let ended = at(&r["ended_at"]);
    assert_eq!(ended, seen + chrono::Duration::seconds(6));
    let billed = u64::try_from((ended - t0).num_seconds()).expect("billed seconds");
    assert_eq!(r["charged"], json!(charge(&r["price_per_hour"], billed)));
    assert_eq!(r["held"], json!(Money::from_micros(0)));
    app.assert_consistent().await;
    // Back, the old agent stops what it still runs; the reservation stays lost.
    let old = app.sim_executor(&first);
    app.restart_agent(&first).await;
    app.eventually("the stale copy to be stopped", || async {
        epochs_on(&old, &id).await.is_empty()
    })
    .await;
    assert_eq!(
        app.wait_status(&t.client, &id, "lost").await["status"],
        "lost"
    );
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    work_that_chose_stop_ends_lost,
    work_that_chose_stop_ends_lost
);

/// A partition instead of a crash: the agent is alive but cut off. With a lease shorter than
/// the node TTL it stops its copy before the control plane runs the work elsewhere, so no two
/// nodes ever run the reservation, whatever the epoch (real clock).
async fn a_partitioned_agent_fences_itself_first(backend: gpurent_store::Backend) {
    let app = TestApp::with(backend)
        .with_liveness(Duration::from_secs(2), 3)
        .with_agent_lease(Duration::from_secs(5))
        .with_cuttable_links()
        .with_sim_gpus("1xRTX4090")
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let t = app.tenant("tia", "100").await;
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, 201, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let r = app.wait_status(&t.client, &id, "running").await;
    let first = r["node"].as_str().unwrap().to_owned();
    let other = other_node(&first);
    let (old, _, stop_watch, watcher) = watch_both(&app, &first, other, true);
    app.cut(&first);
    let mut moved = false;
    for _ in 0..300 {
        let (_, r) = t.client.get(&format!("/api/v1/reservations/{id}")).await;
        if r["status"] == "running" && r["node"] == other && r["epoch"] == 2 {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(moved, "the reservation did not run elsewhere within 15 s");
    assert!(
        epochs_on(&old, &id).await.is_empty(),
        "the cut-off agent fenced itself"
    );
    assert_eq!(app.node_status(&first).await, "lost");
    app.heal(&first);
    app.eventually("the old node to be ready", || async {
        app.node_status(&first).await == "ready"
    })
    .await;
    let (_, r) = t.client.get(&format!("/api/v1/reservations/{id}")).await;
    assert_eq!(
        (r["node"].as_str(), r["epoch"].as_i64()),
        (Some(other), Some(2))
    );
    assert!(epochs_on(&old, &id).await.is_empty());
    stop_watch.store(true, Ordering::Relaxed);
    let problems = watcher.await.expect("watcher");
    assert!(problems.is_empty(), "{problems:?}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    a_partitioned_agent_fences_itself_first,
    a_partitioned_agent_fences_itself_first
);
