//! Webhooks through the API, on both stores, with a real HTTP receiver on loopback and a real
//! agent: a test delivery signed with the secret shown once; a 500 retried after its back-off
//! and then delivered, both attempts kept; a redirect and a receiver that never answers
//! recorded as failed attempts; budget alerts and a reservation the platform ended delivered
//! once each; bad webhooks refused saying why; a team's webhooks its admins' only.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use chrono::Duration;
use gpurent_server::ServerConfig;
use gpurent_store::Backend;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::app::TestApp;
use crate::both_stores;

/// What the receiver answers next: a status (with a `Location` for a redirect), or nothing
/// for this long.
#[derive(Clone, Copy)]
enum Answer {
    Status(u16),
    Hang(u64),
}

#[derive(Default)]
struct Receiver {
    got: Mutex<Vec<(HeaderMap, Bytes)>>,
    script: Mutex<VecDeque<Answer>>,
}

/// A receiver on loopback: its URL and what it got.
async fn receiver() -> (String, Arc<Receiver>) {
    let r = Arc::new(Receiver::default());
    let shared = r.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let r = shared.clone();
            async move {
                let answer = r
                    .script
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or(Answer::Status(200));
                r.got.lock().unwrap().push((headers, body));
                match answer {
                    Answer::Status(s) => {
                        let mut h = HeaderMap::new();
                        h.insert("location", "http://169.254.169.254/".parse().unwrap());
                        (AxumStatus::from_u16(s).unwrap(), h, "said so")
                    }
                    Answer::Hang(secs) => {
                        tokio::time::sleep(StdDuration::from_secs(secs)).await;
                        (AxumStatus::OK, HeaderMap::new(), "late")
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), r)
}

impl Receiver {
    fn events(&self) -> Vec<Value> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(_, body)| serde_json::from_slice(body).unwrap())
            .collect()
    }

    fn count(&self, kind: &str) -> usize {
        self.events().iter().filter(|e| e["event"] == kind).count()
    }
}

fn private_and_quick(config: &mut ServerConfig) {
    config.notifications.allow_private = true;
    config.notifications.timeout = StdDuration::from_secs(1);
}

async fn deliveries(client: &crate::app::Client, hook: &str) -> Vec<Value> {
    let (status, d) = client
        .get(&format!("/api/v1/notifications/{hook}/deliveries"))
        .await;
    assert_eq!(status, StatusCode::OK, "{d}");
    d.as_array().unwrap().clone()
}

async fn webhooks_are_signed_retried_and_kept(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_manual_clock()
        .with_config(private_and_quick)
        .start()
        .await;
    let (url, rx) = receiver().await;
    let rita = app.tenant("rita", "1000").await;

    // Bad webhooks say why.
    for (body, why) in [
        (json!({"url": "ftp://example.com/x"}), "http:// or https://"),
        (json!({"url": "http://u:p@127.0.0.1/x"}), "no user name"),
        (json!({"url": url, "events": ["nope"]}), "not an event"),
        (
            json!({"url": "http://no-such-host.invalid/x"}),
            "does not resolve",
        ),
    ] {
        let (status, bad) = rita.client.post("/api/v1/notifications", &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert!(bad.to_string().contains(why), "{why}: {bad}");
    }
    let (status, hook) = rita
        .client
        .post("/api/v1/notifications", &json!({"url": url}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{hook}");
    let secret = hook["secret"].as_str().unwrap().to_owned();
    let id = hook["id"].as_str().unwrap().to_owned();
    let (_, listed) = rita.client.get("/api/v1/notifications").await;
    assert_eq!(listed[0]["events"], json!(["*"]), "{listed}");
    assert!(listed[0].get("secret").is_none(), "shown once: {listed}");

    // A test: delivered, signed with the secret.
    let (status, queued) = rita
        .client
        .post(&format!("/api/v1/notifications/{id}/test"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    app.eventually("the test to arrive", || async { rx.count("test") == 1 })
        .await;
    {
        let got = rx.got.lock().unwrap();
        let (headers, body) = &got[0];
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        assert_eq!(headers["x-gpurent-signature"], expected.as_str());
        assert_eq!(headers["x-gpurent-event"], "test");
    }

    // A 500, then a redirect (never followed), then a receiver that does not answer in time:
    // each attempt kept with its answer, each retried after its back-off; then delivered.
    rx.script
        .lock()
        .unwrap()
        .extend([Answer::Status(500), Answer::Status(302), Answer::Hang(3)]);
    rita.client
        .post(&format!("/api/v1/notifications/{id}/test"), &json!({}))
        .await;
    let tried = |n: usize| {
        let client = rita.client.clone();
        let id = id.clone();
        move || {
            let (client, id) = (client.clone(), id.clone());
            async move {
                deliveries(&client, &id).await[0]["attempts"]
                    .as_array()
                    .unwrap()
                    .len()
                    == n
            }
        }
    };
    app.eventually("the first attempt", tried(1)).await;
    for (n, wait) in [(2, 31), (3, 61), (4, 121)] {
        app.advance(Duration::seconds(wait));
        app.maintenance_tick().await;
        app.eventually("the next attempt", tried(n)).await;
    }
    let d = &deliveries(&rita.client, &id).await[0];
    assert_eq!(d["state"], "delivered", "{d}");
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["status"], 500, "{d}");
    assert!(
        attempts[1]["error"]
            .as_str()
            .unwrap()
            .contains("redirects are not followed"),
        "{d}"
    );
    assert!(
        attempts[2]["error"]
            .as_str()
            .unwrap()
            .contains("no answer within 1 s"),
        "{d}"
    );
    assert_eq!(attempts[3]["status"], 200, "{d}");

    // Budget alerts and the reservation the budget stopped: once each, whatever the passes.
    let (status, r) = rita
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 10}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let reservation = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&rita.client, &reservation, "running").await;
    app.advance(Duration::hours(1));
    app.maintenance_tick().await;
    let body = json!({"monthly": "2", "alert_at": [50, 100], "stop_at_limit": true});
    let (status, _, set) = rita.client.send("PUT", "/api/v1/budget", Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    app.wait_status(&rita.client, &reservation, "stopped").await;
    for _ in 0..3 {
        app.maintenance_tick().await;
    }
    app.eventually("the alerts and the ending", || async {
        rx.count("budget_alert") == 2 && rx.count("reservation_ended") == 1
    })
    .await;
    let ended = rx
        .events()
        .into_iter()
        .find(|e| e["event"] == "reservation_ended")
        .unwrap();
    assert_eq!(
        (
            ended["data"]["reservation_id"].as_str(),
            ended["data"]["end_reason"].as_str()
        ),
        (Some(reservation.as_str()), Some("budget")),
        "{ended}"
    );
    app.maintenance_tick().await;
    assert_eq!(rx.count("budget_alert"), 2, "once each");

    // Removed: with its deliveries.
    let (status, _, _) = rita
        .client
        .send("DELETE", &format!("/api/v1/notifications/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = rita
        .client
        .get(&format!("/api/v1/notifications/{id}/deliveries"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.shutdown().await;
}
both_stores!(webhooks, webhooks_are_signed_retried_and_kept);

async fn a_private_webhook_is_refused_and_a_teams_is_its_admins(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (url, _rx) = receiver().await;
    let olga = app.tenant("olga", "10").await;
    let mia = app.tenant("mia", "0").await;
    let eve = app.tenant("eve", "0").await;
    let (status, refused) = olga
        .client
        .post("/api/v1/notifications", &json!({"url": url}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        refused.to_string().contains("not a public address"),
        "{refused}"
    );
    for metadata in [
        "http://169.254.169.254/latest",
        "http://[::1]:80/x",
        "http://10.0.0.1/",
    ] {
        let (status, _) = olga
            .client
            .post("/api/v1/notifications", &json!({"url": metadata}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{metadata}");
    }
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
    let body = json!({"url": "http://93.184.215.14/hook", "team": "lab"});
    let (status, denied) = mia.client.post("/api/v1/notifications", &body).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{denied}");
    let (status, _) = eve.client.post("/api/v1/notifications", &body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, made) = olga.client.post("/api/v1/notifications", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["id"].as_str().unwrap();
    // Another's webhook is unknown to an outsider, and not a member's to remove.
    let path = format!("/api/v1/notifications/{id}");
    let (status, _, _) = eve.client.send("DELETE", &path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = mia.client.send("DELETE", &path, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = olga.client.send("DELETE", &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    app.shutdown().await;
}
both_stores!(
    webhook_targets,
    a_private_webhook_is_refused_and_a_teams_is_its_admins
);

/// A managed job's restart is told once, with its count; its end as any reservation's.
async fn a_managed_jobs_restarts_are_told(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .with_config(private_and_quick)
        .start()
        .await;
    let (url, rx) = receiver().await;
    let tom = app.tenant("tom", "100").await;
    let body = json!({"url": url, "events": ["reservation_restarted"]});
    let (status, hook) = tom.client.post("/api/v1/notifications", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{hook}");
    let (status, r) = tom
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "2"],
            "restart": "on-failure", "max_restarts": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let job = r["id"].as_str().unwrap().to_owned();
    app.eventually("the restart", || async {
        let (_, r) = tom.client.get(&format!("/api/v1/reservations/{job}")).await;
        r["epoch"] == 2
    })
    .await;
    for _ in 0..3 {
        app.maintenance_tick().await;
    }
    app.eventually("the restart told", || async {
        rx.count("reservation_restarted") == 1
    })
    .await;
    let told = rx
        .events()
        .into_iter()
        .find(|e| e["event"] == "reservation_restarted")
        .unwrap();
    assert_eq!(told["data"]["reservation_id"], job.as_str(), "{told}");
    assert_eq!(told["data"]["restart_count"], 1, "{told}");
    app.advance(Duration::seconds(5));
    app.maintenance_tick().await;
    app.wait_status(&tom.client, &job, "failed").await;
    for _ in 0..3 {
        app.maintenance_tick().await;
    }
    assert_eq!(
        rx.count("reservation_restarted"),
        1,
        "once: {:?}",
        rx.events()
    );
    app.shutdown().await;
}
both_stores!(restarts, a_managed_jobs_restarts_are_told);
