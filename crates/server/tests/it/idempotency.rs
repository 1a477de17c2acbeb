//! `Idempotency-Key`: a retried POST returns the first answer; another body with the key is 422.

use gpurent_server::hash_token;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, IdempotencyClaim};
use gpurent_types::api::CreateUser;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn retried_requests_happen_once(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("4xRTX4090")
        .start()
        .await;
    let t = app.tenant("retry", "100").await;
    let body = json!({"gpu_type": "rtx4090", "hours": 1});
    let tries = (0..5).map(|_| {
        t.client
            .post_with_key("/api/v1/reservations", &body, "key-1")
    });
    let answers = futures::future::join_all(tries).await;
    let ids: std::collections::BTreeSet<_> = answers
        .iter()
        .map(|(s, r)| {
            assert_eq!(*s, StatusCode::CREATED, "{r}");
            r["id"].as_str().map(str::to_owned)
        })
        .collect();
    assert_eq!(ids.len(), 1, "{answers:?}");
    let (_, list) = t.client.get("/api/v1/reservations").await;
    assert_eq!(list.as_array().map(Vec::len), Some(1));

    let (status, answer) = t
        .client
        .post_with_key(
            "/api/v1/reservations",
            &json!({"gpu_type": "rtx4090", "hours": 2}),
            "key-1",
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );

    // Credit grants too (2.50 of the balance is held for the reservation above).
    let admin = app.admin();
    let path = format!("/api/v1/users/{}/credit", t.id);
    for _ in 0..3 {
        let (status, g) = admin
            .post_with_key(&path, &json!({"amount": "5"}), "grant-1")
            .await;
        assert_eq!(
            (status, g["balance"].as_str()),
            (StatusCode::OK, Some("102.50"))
        );
    }
    let (status, _) = admin
        .post_with_key(&path, &json!({"amount": "6"}), "grant-1")
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(idempotency_keys, retried_requests_happen_once);

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn code(answer: &serde_json::Value) -> Option<&str> {
    answer["error"]["code"].as_str()
}

/// A user's token is shown once, and again to a retry with the same key: the answer is kept
/// sealed under the key.
async fn user_creation_is_replayed_with_its_token(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let admin = app.admin();
    let body = json!({"name": "carol", "role": "tenant", "credit": "10"});
    let (status, first) = admin.post_with_key("/api/v1/users", &body, "user-1").await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, again) = admin.post_with_key("/api/v1/users", &body, "user-1").await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(again, first);
    assert!(first["token"]
        .as_str()
        .is_some_and(|t| t.starts_with("gpr_")));
    let carol = app.client(first["token"].as_str());
    let (status, balance) = carol.get("/api/v1/balance").await;
    assert_eq!(
        (status, balance["balance"].as_str()),
        (StatusCode::OK, Some("10.00"))
    );

    // The key with another body is refused; another key is another request (the name is taken).
    let other = json!({"name": "carol", "role": "tenant", "credit": "20"});
    let (status, answer) = admin.post_with_key("/api/v1/users", &other, "user-1").await;
    assert_eq!(
        (status, code(&answer)),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );
    for key in ["user-2", "user-2"] {
        // A failed request keeps nothing: its retry runs again and fails the same way.
        let (status, answer) = admin.post_with_key("/api/v1/users", &body, key).await;
        assert_eq!(
            (status, code(&answer)),
            (StatusCode::CONFLICT, Some("conflict"))
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("already exists")),
            "{answer}"
        );
    }
    let (_, users) = admin.get("/api/v1/users").await;
    assert_eq!(users.as_array().map(Vec::len), Some(2), "{users}");

    // Concurrent tries with one key: one user; each answer is it, or "still in progress".
    let body = json!({"name": "dan"});
    let tries = (0..5).map(|_| admin.post_with_key("/api/v1/users", &body, "user-3"));
    let answers = futures::future::join_all(tries).await;
    let (_, dan) = admin.post_with_key("/api/v1/users", &body, "user-3").await;
    assert!(dan["token"].is_string(), "{dan}");
    for (status, answer) in &answers {
        match *status {
            StatusCode::CREATED => assert_eq!(answer, &dan),
            StatusCode::CONFLICT => assert!(
                answer["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("in progress")),
                "{answer}"
            ),
            other => panic!("{other}: {answer}"),
        }
    }
    let (_, users) = admin.get("/api/v1/users").await;
    assert_eq!(users.as_array().map(Vec::len), Some(3), "{users}");

    // The database keeps the answer sealed: no token in it, and only the key's hash.
    let admin_id = users
        .as_array()
        .and_then(|us| us.iter().find(|u| u["name"] == "admin"))
        .and_then(|u| u["id"].as_str())
        .expect("admin")
        .to_owned();
    let request: CreateUser =
        serde_json::from_value(json!({"name": "carol", "role": "tenant", "credit": "10"}))
            .expect("body");
    let request_hash = hash_token(&serde_json::to_string(&request).expect("json"));
    let stored = app
        .store
        .begin_idempotent(
            &format!("users.create:{admin_id}"),
            &hash_token("user-1"),
            &request_hash,
            chrono::Utc::now(),
        )
        .await
        .expect("claim");
    let IdempotencyClaim::Replay {
        status,
        sealed_response,
    } = stored
    else {
        panic!("{stored:?}");
    };
    assert_eq!(status, 201);
    let token = first["token"].as_str().expect("token");
    assert!(!sealed_response.contains(token) && !sealed_response.contains("carol"));
    assert!(!sealed_response.contains(&hex_of(token.as_bytes())));
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(user_creation, user_creation_is_replayed_with_its_token);

/// A join token is replayed to a retry with the same key, and it registers a node; keys are
/// per caller and per route.
async fn join_token_is_replayed(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let admin = app.admin();
    let path = "/api/v1/nodes/join-token";
    let (status, first) = admin.post_with_key(path, &json!({}), "join-1").await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    // With a body or without, it is the same request.
    let (status, again) = admin.post_empty_with_key(path, "join-1").await;
    assert_eq!((status, &again), (StatusCode::CREATED, &first));
    let (status, again) = admin.post_with_key(path, &json!({}), "join-1").await;
    assert_eq!((status, &again), (StatusCode::CREATED, &first));
    let (_, fresh) = admin.post_with_key(path, &json!({}), "join-2").await;
    assert_ne!(fresh["token"], first["token"]);

    let register = json!({
        "join_token": first["token"],
        "name": "idem-node",
        "executor": "sim",
        "gpu_backend": "sim",
        "gpus": [{"index": 0, "uuid": "GPU-idem-0", "model": "NVIDIA GeForce RTX 4090",
                  "vram_mb": 24564}],
    });
    let (status, node) = app
        .anonymous()
        .post("/api/v1/agent/register", &register)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    let (_, nodes) = admin.get("/api/v1/nodes").await;
    assert!(
        nodes
            .as_array()
            .is_some_and(|ns| ns.iter().any(|n| n["name"] == "idem-node")),
        "{nodes}"
    );

    // A host's key is its own: the same key gives it its own token.
    let host = app.user("hoster", "host", "0").await;
    let (status, hosts) = host.client.post_with_key(path, &json!({}), "join-1").await;
    assert_eq!(status, StatusCode::CREATED, "{hosts}");
    assert_ne!(hosts["token"], first["token"]);
    let (_, hosts_again) = host.client.post_with_key(path, &json!({}), "join-1").await;
    assert_eq!(hosts_again, hosts);
    // And a key is per route: the admin's join key names a new request on /users.
    let (status, user) = admin
        .post_with_key("/api/v1/users", &json!({"name": "erin"}), "join-1")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{user}");
    // A tenant may not make join tokens, key or not.
    let tenant = app.tenant("tina", "0").await;
    let (status, _) = tenant
        .client
        .post_with_key(path, &json!({}), "join-1")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    app.shutdown().await;
}
both_stores!(join_tokens, join_token_is_replayed);
