//! Tenants can neither see nor touch another tenant's reservations, users or balance, and
//! admin endpoints refuse everyone else.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn tenants_are_isolated(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let alice = app.tenant("alice", "50").await;
    let mallory = app.tenant("mallory", "50").await;
    let (_, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    let id = r["id"].as_str().expect("id").to_owned();

    // Every endpoint that takes an id answers 404 for another tenant's, exactly as for a
    // reservation that does not exist, so ids cannot be probed.
    for path in [
        format!("/api/v1/reservations/{id}"),
        format!("/api/v1/reservations/{id}/logs"),
        format!("/api/v1/users/{}", alice.id),
    ] {
        let (status, body) = mallory.client.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(body["error"]["code"], "not_found");
    }
    let (status, _) = mallory
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, missing) = mallory
        .client
        .get("/api/v1/reservations/00000000-0000-0000-0000-000000000000")
        .await;
    let (_, other) = mallory
        .client
        .get(&format!("/api/v1/reservations/{id}"))
        .await;
    assert_eq!(missing["error"]["code"], other["error"]["code"]);

    let (_, list) = mallory.client.get("/api/v1/reservations").await;
    assert_eq!(list, json!([]));
    let (_, own) = alice
        .client
        .get(&format!("/api/v1/users/{}", alice.id))
        .await;
    assert_eq!(own["name"], "alice");
    let (_, all) = app.admin().get("/api/v1/reservations").await;
    assert_eq!(all.as_array().map(Vec::len), Some(1));

    // Admin-only endpoints.
    let forbidden = [
        (
            "POST",
            "/api/v1/users".to_owned(),
            json!({"name": "eve", "credit": "1000000"}),
        ),
        (
            "POST",
            format!("/api/v1/users/{}/credit", mallory.id),
            json!({"amount": "1000"}),
        ),
        ("POST", "/api/v1/nodes/join-token".to_owned(), json!({})),
        ("GET", "/api/v1/nodes".to_owned(), json!(null)),
        ("GET", "/api/v1/users".to_owned(), json!(null)),
    ];
    for (method, path, body) in forbidden {
        let (status, answer) = if method == "GET" {
            mallory.client.get(&path).await
        } else {
            mallory.client.post(&path, &body).await
        };
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden");
    }
    let (_, balance) = mallory.client.get("/api/v1/balance").await;
    assert_eq!(balance["balance"], "50.00");

    // No token or a bad one: 401 everywhere.
    let (status, body) = app.anonymous().get("/api/v1/offers").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    let (status, _) = app
        .client(Some("gpr_forged"))
        .get(&format!("/api/v1/reservations/{id}"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A user token is not a node credential.
    let (status, _) = alice
        .client
        .post("/api/v1/agent/sync", &json!({"gpus": [], "instances": []}))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    app.shutdown().await;
}
both_stores!(isolation, tenants_are_isolated);
