//! Crash safety: kill -9 the control plane in the middle of a reservation storm, restart it,
//! and every reservation is either fully there or not at all, with no GPU leaked.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpurent_store::prelude::*;
use gpurent_store::testing::TestDatabase;
use gpurent_store::{Backend, Scope, SqlStore};
use serde_json::{json, Value};

use crate::support::{cli, eventually, read_token, Daemon};

/// Acknowledged reservations before the control plane is killed.
const STORM_BEFORE_KILL: usize = 100;

/// Fires reservations (and some stops) from several threads until `stop` is set; returns the
/// ids the server acknowledged with 201.
fn storm(
    url: &str,
    token: &str,
    stop: Arc<Mutex<bool>>,
    count: Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<Vec<String>>> {
    (0..6)
        .map(|worker| {
            let (url, token, stop, count) = (
                url.to_owned(),
                token.to_owned(),
                stop.clone(),
                count.clone(),
            );
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let http = reqwest::Client::new();
                    let mut acked = Vec::new();
                    let mut i = 0u32;
                    while !*stop.lock().unwrap() {
                        i += 1;
                        let body = json!({"gpu_type": "rtx4090", "hours": 1});
                        let sent = http
                            .post(format!("{url}/api/v1/reservations"))
                            .bearer_auth(&token)
                            .json(&body)
                            .timeout(Duration::from_secs(5))
                            .send()
                            .await;
                        let Ok(response) = sent else {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        };
                        let status = response.status();
                        assert!(!status.is_server_error(), "the storm got {status}");
                        if status != reqwest::StatusCode::CREATED {
                            continue;
                        }
                        {
                            let Ok(r) = response.json::<Value>().await else {
                                continue;
                            };
                            let id = r["id"].as_str().unwrap_or_default().to_owned();
                            if (i + worker).is_multiple_of(3) {
                                let _ = http
                                    .post(format!("{url}/api/v1/reservations/{id}/stop"))
                                    .bearer_auth(&token)
                                    .timeout(Duration::from_secs(5))
                                    .send()
                                    .await;
                            }
                            acked.push(id);
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    acked
                })
            })
        })
        .collect()
}

async fn assert_all_or_nothing(store: &SqlStore, acked: &BTreeSet<String>) {
    let problems = store.allocation_problems().await.unwrap();
    assert!(problems.is_empty(), "after kill -9: {problems:?}");
    let ledger = store.ledger_check().await.unwrap();
    assert!(ledger.ok(), "{ledger:?}");
    for id in acked {
        let r = store.get_reservation(id, &Scope::All).await;
        assert!(r.is_ok(), "acknowledged reservation {id} lost: {r:?}");
    }
}

fn tenant(url: &str, admin: &str) -> String {
    let t = cli(
        url,
        Some(admin),
        true,
        &["users", "create", "stormy", "--credit", "100000"],
    )
    .json();
    t["token"].as_str().unwrap().to_owned()
}

/// Kill -9 mid-storm, check the store, restart and let everything converge.
fn storm_and_kill(mut daemon: Daemon, token: &str) -> BTreeSet<String> {
    let stop = Arc::new(Mutex::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let workers = storm(&daemon.url, token, stop.clone(), count.clone());
    // Let the storm build up (on a slow machine too), then pull the plug while it rages.
    for _ in 0..400 {
        if count.load(Ordering::SeqCst) >= STORM_BEFORE_KILL {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.kill9();
    *stop.lock().unwrap() = true;
    let acked: BTreeSet<String> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert!(
        acked.len() >= 10,
        "the storm was too weak to test anything: {} reservations",
        acked.len()
    );
    eprintln!(
        "killed the control plane after {} acknowledged reservations",
        acked.len()
    );
    acked
}

fn converge(url: &str, token: &str, acked: &BTreeSet<String>) {
    eventually("every reservation to settle after the restart", 60, || {
        let list = cli(url, Some(token), true, &["ls"]).json();
        let rs = list.as_array().cloned().unwrap_or_default();
        let ids: BTreeSet<String> = rs
            .iter()
            .filter_map(|r| r["id"].as_str().map(str::to_owned))
            .collect();
        assert!(
            acked.is_subset(&ids),
            "acknowledged reservations missing after restart"
        );
        rs.iter()
            .all(|r| matches!(r["status"].as_str(), Some("running" | "stopped")))
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_storm_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "up",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--sim-gpus",
        "256xRTX4090",
        "--executor",
        "sim",
    ];
    let up = Daemon::start(&args, &dir.path().join("up1.log"));
    let token = tenant(&up.url, &read_token(&data));
    let acked = tokio::task::spawn_blocking({
        let token = token.clone();
        move || storm_and_kill(up, &token)
    })
    .await
    .unwrap();

    let url = format!("sqlite://{}", data.join("gpurent.db").display());
    let store = SqlStore::connect(&url).await.unwrap();
    assert_all_or_nothing(&store, &acked).await;
    store.close().await;

    let up = Daemon::start(&args, &dir.path().join("up2.log"));
    let restarted_url = up.url.clone();
    tokio::task::spawn_blocking(move || converge(&restarted_url, &token, &acked))
        .await
        .unwrap();
    let store = SqlStore::connect(&url).await.unwrap();
    assert_all_or_nothing(&store, &BTreeSet::new()).await;
    drop(up);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_the_server_during_a_storm_on_postgres() {
    let db = TestDatabase::new(Backend::Postgres).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server_args = |port: &str| {
        vec![
            "server".to_owned(),
            "--data-dir".to_owned(),
            data.to_str().unwrap().to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--database-url".to_owned(),
            db.url.clone(),
        ]
    };
    let args = server_args("0");
    let server = Daemon::start(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.path().join("s1.log"),
    );
    let port = server.url.rsplit(':').next().unwrap().to_owned();
    let admin = read_token(&data);
    let join = cli(&server.url, Some(&admin), true, &["nodes", "join-token"]).json();
    let agent_dir = dir.path().join("agent");
    let _agent = Daemon::start_quiet(
        &[
            "--server",
            &server.url,
            "agent",
            "--join-token",
            join["token"].as_str().unwrap(),
            "--data-dir",
            agent_dir.to_str().unwrap(),
            "--name",
            "gpu-host-1",
            "--sim-gpus",
            "256xRTX4090",
            "--executor",
            "sim",
        ],
        &dir.path().join("agent.log"),
    );
    let url = server.url.clone();
    eventually("the agent to join", 30, || {
        cli(&url, Some(&admin), true, &["nodes", "ls"]).json()[0]["status"] == "ready"
    });
    let token = tenant(&server.url, &admin);
    let acked = tokio::task::spawn_blocking({
        let token = token.clone();
        move || storm_and_kill(server, &token)
    })
    .await
    .unwrap();

    let store = SqlStore::connect(&db.url).await.unwrap();
    assert_all_or_nothing(&store, &acked).await;

    // Same port, so the agent (which kept running) finds the control plane again.
    let args = server_args(&port);
    let server = Daemon::start(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.path().join("s2.log"),
    );
    let restarted_url = server.url.clone();
    tokio::task::spawn_blocking(move || converge(&restarted_url, &token, &acked))
        .await
        .unwrap();
    assert_all_or_nothing(&store, &BTreeSet::new()).await;
    store.close().await;
    drop(server);
}
