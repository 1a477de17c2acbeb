//! Allocation is race-free: many simultaneous reservations never double-book a GPU.

use std::collections::BTreeSet;

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn fifty_reservations_for_four_gpus(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let mut tenants = Vec::new();
    for i in 0..5 {
        tenants.push(app.tenant(&format!("t{i}"), "1000").await);
    }
    let requests = (0..50).map(|i| {
        let client = tenants[i % tenants.len()].client.clone();
        async move {
            client
                .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
                .await
        }
    });
    let results = futures::future::join_all(requests).await;

    let won: Vec<_> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .collect();
    let lost: Vec<_> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CONFLICT)
        .collect();
    assert_eq!(won.len(), 4, "{results:?}");
    assert_eq!(lost.len(), 46, "{results:?}");
    assert!(
        lost.iter()
            .all(|(_, b)| b["error"]["code"] == "no_capacity"),
        "{lost:?}"
    );
    let gpus: BTreeSet<String> = won
        .iter()
        .flat_map(|(_, r)| r["gpus"].as_array().cloned().unwrap_or_default())
        .filter_map(|g| g.as_str().map(str::to_owned))
        .collect();
    assert_eq!(gpus.len(), 4, "a GPU was given twice: {won:?}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(fifty_for_four, fifty_reservations_for_four_gpus);

async fn shares_never_exceed_a_gpu(backend: Backend) {
    // One 24 GB GPU: 30 concurrent 5 GB shares, at most 4 fit (20 GB).
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let t = app.tenant("sharer", "1000").await;
    let requests = (0..30).map(|_| {
        let client = t.client.clone();
        async move {
            client
                .reserve(json!({"gpu_type": "rtx4090", "vram_gb": 5, "hours": 1}))
                .await
        }
    });
    let results = futures::future::join_all(requests).await;
    let won = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    assert_eq!(won, 4, "{results:?}");
    let (_, r) = results
        .iter()
        .find(|(s, _)| *s == StatusCode::CREATED)
        .cloned()
        .unwrap_or_default();
    assert_eq!(r["vram_gb"], 5);
    // A share costs its part of the card: 5,120 of 24,564 MiB of 2.50, rounded up.
    assert_eq!(r["price_per_hour"], "0.521088");
    // A whole GPU is not free while shares use it.
    let (status, _) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(shares, shares_never_exceed_a_gpu);

/// Clients that hang up mid-request (a dropped long poll, a CLI stopped with Ctrl-C) never
/// cut a store transaction in half: afterwards the store works and is consistent.
async fn clients_that_hang_up_leave_nothing_broken(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("4xRTX4090")
        .start()
        .await;
    let t = app.tenant("impatient", "10000").await;
    let requests = (0..400u64).map(|i| {
        let client = t.client.clone();
        async move {
            // Give up after 0.3 to 4 ms: some requests never arrive, some are cut mid-way.
            let patience = std::time::Duration::from_micros(300 + (i * 7919) % 3700);
            let _ = tokio::time::timeout(
                patience,
                client.reserve(json!({"gpu_type": "rtx4090", "hours": 1, "vram_gb": 1})),
            )
            .await;
        }
    });
    futures::future::join_all(requests).await;
    // Whatever was cut off, the next requests are served.
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "vram_gb": 1}))
        .await;
    assert!(
        status == StatusCode::CREATED || status == StatusCode::CONFLICT,
        "{status}: {r}"
    );
    let (status, list) = t.client.get("/api/v1/reservations").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    for r in list.as_array().cloned().unwrap_or_default() {
        let (status, _) = t
            .client
            .post(
                &format!(
                    "/api/v1/reservations/{}/stop",
                    r["id"].as_str().unwrap_or_default()
                ),
                &json!({}),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(hang_ups, clients_that_hang_up_leave_nothing_broken);
