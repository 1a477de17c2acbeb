//! `Idempotency-Key`: a retried POST returns the first answer; another body with the key is 422.

use gpurent_store::Backend;
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
