//! Bad input gets a clear 4xx naming the problem, never a 5xx, and leaves nothing behind.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn bad_requests_are_refused_cleanly(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let t = app.tenant("tess", "100").await;
    let cases = [
        (
            json!({"gpu_type": "H100", "hours": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_gpu_type",
            "H100",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "gpu_count",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": 100000}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "gpu_count",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": -1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "gpu_count",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": 3}),
            StatusCode::CONFLICT,
            "no_capacity",
            "2",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": -2}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "hours",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": "two"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "hours",
        ),
        (
            json!({"gpu_type": "rtx4090"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "hours",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "gpus": 2}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "gpus",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "tier": "gold"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "tier",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "tier": "spot", "bid": "0.10"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_price",
            "lowest spot price for this request, 1.00/h",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "tier": "spot", "bid": "3"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_price",
            "above the on-demand price 2.50/h",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "tier": "spot", "bid": "-1"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "bid",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 23, "tier": "reserved"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_price",
            "at least 24 hours",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "bid": 2.5}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "bid",
        ),
        (
            json!({"gpu_type": "rtx4090", "hours": 1, "env": {"A=B": "c"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "env",
        ),
        (
            json!([1, 2]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_value",
            "",
        ),
    ];
    for (body, status, code, mentions) in cases {
        let (got, answer) = t.client.reserve(body.clone()).await;
        assert_eq!(got, status, "{body} -> {answer}");
        assert_eq!(answer["error"]["code"], code, "{body} -> {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(mentions),
            "{body}: message {message:?} should mention {mentions:?}"
        );
    }

    // Prepaid: the balance must cover the first hour.
    let pauper = app.tenant("pauper", "2").await;
    let (status, answer) = pauper
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 10}))
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (StatusCode::PAYMENT_REQUIRED, Some("insufficient_credit"))
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("needs 2.50 and the balance is 2.00")),
        "{answer}"
    );

    let raw = [
        (
            "application/json",
            b"{\"gpu_type\": ".to_vec(),
            StatusCode::BAD_REQUEST,
            "malformed_request",
        ),
        (
            "application/json",
            b"not json".to_vec(),
            StatusCode::BAD_REQUEST,
            "malformed_request",
        ),
        (
            "text/plain",
            b"{}".to_vec(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            "application/json",
            vec![b' '; 200 * 1024],
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
    ];
    for (content_type, body, status, code) in raw {
        let (got, answer) = t
            .client
            .post_raw("/api/v1/reservations", content_type, body)
            .await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{answer}"
        );
    }

    let admin = app.admin();
    let users = [
        (
            json!({"name": "", "credit": "1"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"name": "x y"}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!({"name": "neg", "credit": "-5"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"name": "float", "credit": 5.5}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"name": "fine", "credit": "1.0000001"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"name": "root", "role": "superuser"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"name": "tess"}), StatusCode::CONFLICT),
        (
            json!({"name": "rich", "credit": "9000000000000"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (body, status) in users {
        let (got, answer) = admin.post("/api/v1/users", &body).await;
        assert_eq!(got, status, "{body} -> {answer}");
    }
    let (status, _) = admin
        .post("/api/v1/users/nobody/credit", &json!({"amount": "5"}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = admin
        .post(
            &format!("/api/v1/users/{}/credit", t.id),
            &json!({"amount": "0"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, body) = app.anonymous().get("/api/v1/nowhere").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    // Nothing was left behind: no reservation, no GPU taken, no money moved, one extra user.
    let (_, list) = t.client.get("/api/v1/reservations").await;
    assert_eq!(list, json!([]));
    let (_, offers) = t.client.get("/api/v1/offers").await;
    assert_eq!(offers[0]["available"], 2);
    let (_, balance) = t.client.get("/api/v1/balance").await;
    assert_eq!(balance["balance"], "100.00");
    let (_, users) = admin.get("/api/v1/users").await;
    assert_eq!(users.as_array().map(Vec::len), Some(3), "{users}"); // admin, tess, pauper
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(bad_input, bad_requests_are_refused_cleanly);

#[tokio::test]
async fn health_endpoints_answer() {
    let app = TestApp::with(Backend::Sqlite).start().await;
    let (status, body) = app.anonymous().get("/healthz").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, Some("ok\n")));
    let (status, _) = app.anonymous().get("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    app.shutdown().await;
}
