//! Resource limits: 429 with `Retry-After` past a token's or an address's rate, 413 for an
//! oversized body on every route that takes one, 422 for a page limit over the cap, cursor
//! pagination, and the per-tenant caps on live reservations and spend per hour under
//! concurrent requests.

use gpurent_server::{Access, Rate, ServerConfig, POLICY};
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

/// So slow a refill that no token comes back during a test: no timing in the assertions.
const TINY: Rate = Rate {
    per_second: 0.001,
    burst: 3,
};

fn tiny_per_token(config: &mut ServerConfig) {
    config.rate_limits.per_token = Some(TINY);
    config.rate_limits.per_address = None;
}

fn tiny_per_address(config: &mut ServerConfig) {
    config.rate_limits.per_token = None;
    config.rate_limits.per_address = Some(TINY);
}

fn no_rate_limits(config: &mut ServerConfig) {
    config.rate_limits.per_token = None;
    config.rate_limits.per_address = None;
}

/// Sends `n` reservations at once; every one refused must be refused by the cap named
/// `cap`. How many were created.
async fn at_once(client: &Client, body: &Value, n: usize, cap: &str) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (client, body) = (client.clone(), body.clone());
            tokio::spawn(async move { client.reserve(body).await })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        let (status, body) = task.await.unwrap();
        match status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {
                assert_eq!(body["error"]["code"], "limit_exceeded", "{body}");
                assert!(body["error"]["message"].as_str().unwrap().contains(cap));
            }
            other => panic!("{other}: {body}"),
        }
    }
    created
}
async fn a_burst_gets_429_with_retry_after(backend: Backend) {
    let app = TestApp::with(backend)
        .with_config(tiny_per_token)
        .start()
        .await;
    let tina = app.tenant("tina", "10").await;
    let tom = app.tenant("tom", "10").await;
    for _ in 0..3 {
        let (status, _) = tina.client.get("/api/v1/balance").await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, headers, body) = tina.client.send("GET", "/api/v1/balance", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1, "{retry}");
    // Another token has its own bucket.
    let (status, _) = tom.client.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::OK);
    app.shutdown().await;

    // Per address: anonymous requests too.
    let app = TestApp::with(backend)
        .with_config(tiny_per_address)
        .start()
        .await;
    let anonymous = app.anonymous();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(anonymous.send("GET", "/healthz", None).await.0);
    }
    assert_eq!(
        statuses.last(),
        Some(&StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    app.shutdown().await;
}
both_stores!(rate_limits, a_burst_gets_429_with_retry_after);

fn startup_then_tiny_per_address(config: &mut ServerConfig) {
    config.rate_limits.per_token = None;
    // Room for the test app's own start (a join token, polls until the node is ready).
    config.rate_limits.per_address = Some(Rate {
        per_second: 0.001,
        burst: 200,
    });
}

/// An agent's heartbeats are never refused, even from an address that is over its limit:
/// a node must not look lost because its host's users were busy.
#[tokio::test]
async fn agents_syncs_are_exempt() {
    let app = TestApp::with(Backend::Sqlite)
        .with_sim_gpus("1xRTX4090")
        .with_liveness(std::time::Duration::from_millis(100), 3)
        .with_config(startup_then_tiny_per_address)
        .start()
        .await;
    let anonymous = app.anonymous();
    let mut last = StatusCode::OK;
    for _ in 0..201 {
        last = anonymous.send("GET", "/healthz", None).await.0;
        if last == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
    }
    assert_eq!(last, StatusCode::TOO_MANY_REQUESTS);
    // Ten heartbeats later, from the same address, the node is still heard from.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let recent = chrono::Utc::now() - chrono::Duration::milliseconds(300);
    let nodes = gpurent_store::NodeStore::list_nodes(&*app.store, recent, None)
        .await
        .unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].status, "ready", "{:?}", nodes[0]);
    let (status, _, _) = anonymous.send("GET", "/healthz", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "still limited");
    app.shutdown().await;
}

async fn oversized_bodies_get_413_on_every_route(backend: Backend) {
    let app = TestApp::with(backend)
        .with_config(no_rate_limits)
        .start()
        .await;
    let doc = serde_json::to_value(gpurent_server::openapi_document()).unwrap();
    let big = json!({"name": "x".repeat(70 * 1024)});
    let huge = json!({"name": "x".repeat(5 * 1024 * 1024)});
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            if op.get("requestBody").is_none() {
                continue;
            }
            let method = method.to_uppercase();
            let access = POLICY
                .iter()
                .find(|(m, p, _)| *m == method && p == path)
                .map(|(_, _, a)| *a)
                .unwrap();
            if access == Access::Node && path.ends_with("/sync") {
                // Needs a node credential before its body is read (4 MiB limit).
                continue;
            }
            let body = if access == Access::Node { &huge } else { &big };
            let path = path.replace("{id}", "me");
            let (status, _, answer) = app.admin().send(&method, &path, Some(body)).await;
            assert_eq!(
                status,
                StatusCode::PAYLOAD_TOO_LARGE,
                "{method} {path}: {answer}"
            );
            assert_eq!(answer["error"]["code"], "payload_too_large");
            checked += 1;
        }
    }
    assert!(checked >= 8, "{checked}");
    app.shutdown().await;
}
both_stores!(body_limits, oversized_bodies_get_413_on_every_route);

async fn lists_are_paged(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("4xRTX4090")
        .with_config(no_rate_limits)
        .start()
        .await;
    let tina = app.tenant("tina", "100").await;
    for path in [
        "/api/v1/reservations",
        "/api/v1/users",
        "/api/v1/nodes",
        "/api/v1/tokens",
        "/api/v1/events",
    ] {
        for limit in [0, 1001] {
            let (status, _, body) = app
                .admin()
                .send("GET", &format!("{path}?limit={limit}"), None)
                .await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("limit"),
                "{body}"
            );
        }
        let (status, _, _) = app
            .admin()
            .send("GET", &format!("{path}?limit=1000"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    let mut made = Vec::new();
    for _ in 0..3 {
        let (status, r) = tina
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        made.push(r["id"].as_str().unwrap().to_owned());
    }
    let (_, headers, first) = tina
        .client
        .send("GET", "/api/v1/reservations?limit=2", None)
        .await;
    assert_eq!(first.as_array().unwrap().len(), 2);
    let after = headers["x-next-after"].to_str().unwrap().to_owned();
    let (_, headers, second) = tina
        .client
        .send(
            "GET",
            &format!("/api/v1/reservations?limit=2&after={after}"),
            None,
        )
        .await;
    assert_eq!(second.as_array().unwrap().len(), 1);
    assert!(headers.get("x-next-after").is_none());
    let mut seen: Vec<String> = first
        .as_array()
        .unwrap()
        .iter()
        .chain(second.as_array().unwrap())
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    seen.sort();
    made.sort();
    assert_eq!(seen, made, "every reservation once");
    app.shutdown().await;
}
both_stores!(pagination, lists_are_paged);

async fn caps_hold_under_concurrent_requests(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("8xRTX4090")
        .with_config(no_rate_limits)
        .start()
        .await;
    let tina = app.tenant("tina", "1000").await;
    let tom = app.tenant("tom", "1000").await;
    // Overrides by an admin; a tenant may not set its own.
    let (status, _, user) = app
        .admin()
        .send(
            "PATCH",
            &format!("/api/v1/users/{}", tina.id),
            Some(&json!({"max_reservations": 3})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{user}");
    assert_eq!(user["max_reservations"], 3);
    let (status, _, _) = tom
        .client
        .send(
            "PATCH",
            &format!("/api/v1/users/{}", tom.id),
            Some(&json!({"max_reservations": 99})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = app
        .admin()
        .send(
            "PATCH",
            &format!("/api/v1/users/{}", tom.id),
            Some(&json!({"max_spend_per_hour": "5.00"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    // Ten at once, each a small share: room for all, but tina may have 3 live.
    let body = json!({"gpu_type": "rtx4090", "vram_gb": 1, "hours": 1});
    assert_eq!(
        at_once(&tina.client, &body, 10, "max_reservations").await,
        3
    );

    // Whole RTX 4090s at 2.50/h: two fit under 5.00/h, however many ask at once.
    let body = json!({"gpu_type": "rtx4090", "hours": 1});
    assert_eq!(
        at_once(&tom.client, &body, 6, "max_spend_per_hour").await,
        2
    );
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(tenant_caps, caps_hold_under_concurrent_requests);

fn two_per_tenant(config: &mut ServerConfig) {
    no_rate_limits(config);
    config.tenant_limits.max_reservations = 2;
}

async fn the_platform_default_caps_queued_reservations_too(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_config(two_per_tenant)
        .start()
        .await;
    let tina = app.tenant("tina", "100").await;
    let queued = json!({"gpu_type": "rtx4090", "hours": 1, "queue": true});
    for _ in 0..2 {
        let (status, body) = tina.client.reserve(queued.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) = tina.client.reserve(queued).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "limit_exceeded");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    queued_caps,
    the_platform_default_caps_queued_reservations_too
);

/// A member's caps count what they make for their teams: a capped user who makes a team and
/// moves credit into it reserves no more through it than alone, however many ask at once.
async fn a_members_caps_count_what_they_make_for_teams(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("8xRTX4090")
        .with_config(no_rate_limits)
        .start()
        .await;
    let tina = app.tenant("tina", "1000").await;
    let (status, _, user) = app
        .admin()
        .send(
            "PATCH",
            &format!("/api/v1/users/{}", tina.id),
            Some(&json!({"max_reservations": 3})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{user}");
    let (status, team) = tina
        .client
        .post("/api/v1/teams", &json!({"name": "lab"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{team}");
    let (status, moved) = tina
        .client
        .post("/api/v1/teams/lab/credit", &json!({"amount": "500"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{moved}");

    let share = json!({"gpu_type": "rtx4090", "vram_gb": 1, "hours": 1});
    let (status, body) = tina.client.reserve(share.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Ten for the team at once: two more fit under her cap of three.
    let for_team = json!({"gpu_type": "rtx4090", "vram_gb": 1, "hours": 1, "team": "lab"});
    assert_eq!(
        at_once(&tina.client, &for_team, 10, "max_reservations").await,
        2
    );
    let (status, body) = tina.client.reserve(for_team).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("counting those made for teams") && message.contains("you have 3"),
        "{message}"
    );
    // And her own count holds what she made for the team.
    let (status, body) = tina.client.reserve(share).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("this tenant has 3")),
        "{body}"
    );
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(member_caps, a_members_caps_count_what_they_make_for_teams);
