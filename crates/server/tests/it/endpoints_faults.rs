//! Endpoints when things go wrong or change: a rolling update under load with no failed
//! request; a replica killed under load (only its requests in flight fail, a GET is retried);
//! a replica that never starts (back-off, then `failing` and 503 saying why); an owner out of
//! credit (402); a WebSocket through the URL; an endpoint removed with requests in flight; two
//! control planes scaling one endpoint once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpurent_server::{RunningServer, ServerConfig};
use gpurent_store::{Backend, SqlStore};
use gpurent_types::SystemClock;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::both_stores;
use crate::endpoints_support::{setup, EndpointSetup};

/// Waits until the endpoint has `n` ready replicas.
async fn ready(s: &EndpointSetup, name: &str, n: u64) {
    s.app
        .eventually(&format!("{name} to have {n} ready replicas"), || async {
            s.get(name).await["ready_replicas"] == n
        })
        .await;
}

#[tokio::test]
async fn a_rolling_update_fails_no_request() {
    let s = setup(Backend::Sqlite).await;
    s.create(
        "roll",
        json!({"APP_TAG": "v1"}),
        json!({"min_replicas": 2, "max_replicas": 2, "target_inflight": 1, "public": true}),
    )
    .await;
    ready(&s, "roll", 2).await;
    let done = Arc::new(AtomicBool::new(false));
    let load = (0..2).map(|_| {
        let (http, url, done) = (
            s.http.clone(),
            format!("{}/e/roll/work?ms=30", s.app.base),
            Arc::clone(&done),
        );
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let r = http.post(&url).send().await.unwrap();
                let status = r.status();
                let body = r.text().await.unwrap();
                seen.push((status, body));
            }
            seen
        })
    });
    let load: Vec<_> = load.collect();
    let (status, e) = s
        .client()
        .patch("/api/v1/endpoints/roll", &json!({"env": {"APP_TAG": "v2"}}))
        .await;
    assert_eq!(status, StatusCode::OK, "{e}");
    assert_eq!(e["generation"], 2);
    s.app
        .eventually("every replica to run v2", || async {
            let e = s.get("roll").await;
            let replicas = e["replicas"].as_array().cloned().unwrap_or_default();
            replicas.len() == 2
                && replicas
                    .iter()
                    .all(|r| r["generation"] == 2 && r["ready"] == true)
                && s.executor.serving() == 2
        })
        .await;
    done.store(true, Ordering::Relaxed);
    let mut tags = Vec::new();
    for task in load {
        for (status, body) in task.await.unwrap() {
            // POSTs, which are never retried: each was answered by a replica.
            assert_eq!(status, StatusCode::OK, "{body}");
            let a: Value = serde_json::from_str(&body).unwrap();
            tags.push(a["tag"].as_str().unwrap().to_owned());
        }
    }
    assert!(tags.contains(&"v1".to_owned()) && tags.contains(&"v2".to_owned()));
    assert_eq!(tags.last().map(String::as_str), Some("v2"));
}

#[tokio::test]
async fn a_killed_replica_fails_only_its_requests() {
    let s = setup(Backend::Sqlite).await;
    s.create(
        "kill",
        json!({}),
        json!({"min_replicas": 2, "max_replicas": 2, "target_inflight": 4, "public": true}),
    )
    .await;
    ready(&s, "kill", 2).await;
    // Six slow POSTs, spread three and three.
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let (http, url) = (
                s.http.clone(),
                format!("{}/e/kill/work?ms=1500", s.app.base),
            );
            tokio::spawn(async move {
                let r = http.post(url).send().await.unwrap();
                (r.status(), r.text().await.unwrap())
            })
        })
        .collect();
    s.app
        .eventually("six requests in flight", || async {
            s.get("kill").await["inflight"] == 6
        })
        .await;
    let e = s.get("kill").await;
    let victim = e["replicas"][0]["id"].as_str().unwrap().to_owned();
    let on_victim = e["replicas"][0]["inflight"].as_u64().unwrap();
    assert_eq!(on_victim, 3, "{e}");
    s.executor.kill(&victim);
    let mut failed = 0;
    for call in calls {
        let (status, body) = call.await.unwrap();
        if status == StatusCode::BAD_GATEWAY {
            failed += 1;
        } else {
            assert_eq!(status, StatusCode::OK, "{body}");
            assert!(!body.contains(&victim), "{body}");
        }
    }
    assert_eq!(failed, on_victim, "only the killed replica's requests fail");
    // A GET after it is answered (by the other replica), and a replacement comes.
    for _ in 0..4 {
        let (status, body) = s.send("GET", "kill", "/work").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    s.app
        .eventually("a replacement", || async {
            let e = s.get("kill").await;
            e["ready_replicas"] == 2
                && e["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["id"] != victim.as_str())
        })
        .await;
}

#[tokio::test]
async fn a_replica_that_never_starts_backs_off_then_gives_up() {
    let s = setup(Backend::Sqlite).await;
    let (status, e) = s
        .client()
        .post(
            "/api/v1/endpoints",
            &json!({"name": "crash", "gpu_type": "rtx4090", "command": ["exit", "1"],
                    "port": 8000, "scaling": {"min_replicas": 1, "public": true,
                    "queue_timeout_s": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{e}");
    // Five tries, 0.5 + 1 + 2 + 4 s apart.
    for _ in 0..300 {
        if s.get("crash").await["status"] == "failing" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let e = s.get("crash").await;
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("ended before it was ready"), "{message}");
    assert!(message.contains("failure 5 of 5"), "{message}");
    // Five replicas in all, not one more, even as requests come.
    let (status, body) = s.send("GET", "crash", "/x").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.contains("stopped starting replicas after 5 failures"),
        "{body}"
    );
    let (_, list) = s.client().get("/api/v1/reservations").await;
    let tries = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["endpoint"] == "crash")
        .count();
    assert_eq!(tries, 5, "{list}");
    // An update starts it again.
    let (status, e) = s
        .client()
        .patch("/api/v1/endpoints/crash", &json!({"command": ["app"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{e}");
    ready(&s, "crash", 1).await;
    assert_eq!(s.send("GET", "crash", "/x").await.0, StatusCode::OK);
}

#[tokio::test]
async fn an_owner_out_of_credit_gets_402() {
    let s = setup(Backend::Sqlite).await;
    let (status, u) = s
        .app
        .admin()
        .post(
            "/api/v1/users",
            &json!({"name": "poor", "role": "tenant", "credit": "0"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{u}");
    let poor = s.app.client(u["token"].as_str());
    let (status, e) = poor
        .post(
            "/api/v1/endpoints",
            &json!({"name": "broke", "gpu_type": "rtx4090", "command": ["app"], "port": 8000,
                    "scaling": {"public": true}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{e}");
    let (status, body) = s.send("GET", "broke", "/x").await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
    assert!(body.contains("credit"), "{body}");
    let (_, e) = poor.get("/api/v1/endpoints/broke").await;
    assert_eq!(e["status"], "out_of_credit", "{e}");
    assert_eq!(e["replicas"], json!([]));
}

#[tokio::test]
async fn websockets_pass_and_a_removal_lets_requests_finish() {
    let s = setup(Backend::Sqlite).await;
    s.create("ws", json!({}), json!({"public": true, "min_replicas": 1}))
        .await;
    ready(&s, "ws", 1).await;
    crate::proxy_support::ws_roundtrip(s.addr(), "/e/ws/socket", "X-Any: 1")
        .await
        .unwrap();
    let port = s.addr().port();
    crate::proxy_support::ws_roundtrip_on(
        s.addr(),
        &format!("ws.e.localhost:{port}"),
        "/socket",
        "X-Any: 1",
    )
    .await
    .unwrap();
    // A slow request in flight as the endpoint is removed: it is answered, then the replica
    // stops.
    let (http, url) = (s.http.clone(), format!("{}/e/ws/work?ms=1000", s.app.base));
    let slow = tokio::spawn(async move { http.post(url).send().await.unwrap().status() });
    s.app
        .eventually("the request in flight", || async {
            s.get("ws").await["inflight"] == 1
        })
        .await;
    let (status, _, _) = s
        .client()
        .send("DELETE", "/api/v1/endpoints/ws", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    s.app
        .eventually("the replica to stop", || async {
            s.executor.serving() == 0
        })
        .await;
}

async fn two_control_planes_scale_an_endpoint_once(backend: Backend) {
    let s = setup(backend).await;
    let other = RunningServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(SqlStore::connect(s.app.database_url()).await.unwrap()),
        Arc::new(SystemClock),
        ServerConfig::default(),
    )
    .await
    .unwrap();
    s.create(
        "twice",
        json!({}),
        json!({"min_replicas": 2, "max_replicas": 4, "public": true}),
    )
    .await;
    ready(&s, "twice", 2).await;
    // Both scalers run; for a while nothing more starts.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (_, list) = s.client().get("/api/v1/reservations").await;
    let replicas: HashSet<u64> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["endpoint"] == "twice")
        .map(|r| r["endpoint_replica"].as_u64().unwrap())
        .collect();
    assert_eq!(replicas, HashSet::from([1, 2]), "{list}");
    s.app.assert_consistent().await;
    if backend == Backend::Postgres {
        // Several control planes serve (they relay agents' streams on PostgreSQL): traffic at
        // the one that does not scale the endpoint makes the one that does scale it out.
        s.create(
            "shared",
            json!({}),
            json!({"max_replicas": 3, "target_inflight": 1, "public": true}),
        )
        .await;
        let calls: Vec<_> = (0..3)
            .map(|_| {
                let (http, url) = (
                    s.http.clone(),
                    format!("http://{}/e/shared/work?ms=1500", other.addr),
                );
                tokio::spawn(async move {
                    let r = http.get(url).send().await.unwrap();
                    (r.status(), r.text().await.unwrap())
                })
            })
            .collect();
        let mut answered = HashSet::new();
        for call in calls {
            let (status, body) = call.await.unwrap();
            assert_eq!(status, StatusCode::OK, "{body}");
            let a: Value = serde_json::from_str(&body).unwrap();
            answered.insert(a["replica"].as_str().unwrap().to_owned());
        }
        assert!(answered.len() >= 2, "{answered:?}");
    }
    other.shutdown().await.unwrap();
}

both_stores!(
    two_control_planes,
    two_control_planes_scale_an_endpoint_once
);
