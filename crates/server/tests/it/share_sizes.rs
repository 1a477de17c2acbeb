//! Shares sized against the card: `vram_gb` up to the card's memory to the nearest GB (24 on a
//! 24,564 MiB RTX 4090 is all of it), `vram_fraction` of it, each priced as its part of the
//! card's price, and the requests that are refused, with why.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

async fn reserve(client: &Client, body: Value) -> Value {
    let (status, r) = client.reserve(body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}: {r}");
    r
}

async fn refused(client: &Client, body: Value, status: StatusCode, mentions: &str) {
    let (got, r) = client.reserve(body.clone()).await;
    assert_eq!(got, status, "{body}: {r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(mentions), "{body}: {r}");
}

async fn shares_fit_the_card(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_node("box", "2xRTX4090").await;
    app.wait_nodes_ready().await;
    let t = app.tenant("tess", "100").await;

    // Two halves of one card, by fraction: 12,282 MiB each, half the card's 2.50.
    let half = json!({"gpu_type": "rtx4090", "hours": 1, "vram_fraction": 0.5});
    let a = reserve(&t.client, half.clone()).await;
    let b = reserve(&t.client, half).await;
    assert_eq!(
        (&a["price_per_hour"], &a["vram_gb"]),
        (&json!("1.25"), &json!(12))
    );
    assert_eq!(a["gpus"], b["gpus"], "both halves on one GPU: {a} {b}");
    // 24 GB is all of the other card (24,564 MiB), at the whole card's price.
    let all = reserve(
        &t.client,
        json!({"gpu_type": "RTX 4090", "hours": 1, "vram_gb": 24}),
    )
    .await;
    assert_eq!(
        (&all["price_per_hour"], &all["vram_gb"]),
        (&json!("2.50"), &json!(24))
    );
    assert_ne!(all["gpus"], a["gpus"]);
    assert_eq!(
        app.raw_count("SELECT COUNT(*) FROM allocations WHERE vram_mb = 12282")
            .await,
        2
    );
    assert_eq!(
        app.raw_count("SELECT COUNT(*) FROM allocations WHERE vram_mb = 24564")
            .await,
        1
    );
    // All of a card is still a share: nothing else fits on either card now.
    refused(
        &t.client,
        json!({"gpu_type": "rtx4090", "hours": 1, "vram_gb": 1}),
        StatusCode::CONFLICT,
        "MiB",
    )
    .await;
    refused(
        &t.client,
        json!({"gpu_type": "rtx4090", "hours": 1}),
        StatusCode::CONFLICT,
        "whole",
    )
    .await;
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(shares_fit_the_card_, shares_fit_the_card);

async fn bad_shares_say_why(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_node("box", "1xRTX4090").await;
    app.wait_nodes_ready().await;
    let t = app.tenant("tess", "100").await;
    let unprocessable = StatusCode::UNPROCESSABLE_ENTITY;
    for (body, mentions) in [
        (
            json!({"vram_fraction": 0}),
            "vram_fraction must be more than 0",
        ),
        (json!({"vram_fraction": 1.01}), "at most 1"),
        (json!({"vram_fraction": 0.5, "vram_gb": 8}), "not both"),
        (json!({"vram_fraction": 0.5, "gpu_count": 1}), "gpu_count"),
        (json!({"vram_gb": 12, "gpu_count": 1}), "not both"),
    ] {
        let mut body = body;
        body["gpu_type"] = json!("rtx4090");
        body["hours"] = json!(1);
        refused(&t.client, body, unprocessable, mentions).await;
    }
    // More than the card, and a fraction of a type no node has.
    refused(
        &t.client,
        json!({"gpu_type": "rtx4090", "hours": 1, "vram_gb": 25}),
        StatusCode::CONFLICT,
        "25600 MiB",
    )
    .await;
    refused(
        &t.client,
        json!({"gpu_type": "h200", "hours": 1, "vram_fraction": 0.5}),
        StatusCode::CONFLICT,
        "no node has a GPU of type h200",
    )
    .await;
    // The card is untouched by all of that: all of it is still there.
    let all = reserve(
        &t.client,
        json!({"gpu_type": "rtx4090", "hours": 1, "vram_fraction": 1}),
    )
    .await;
    assert_eq!(all["price_per_hour"], "2.50");
    app.shutdown().await;
}
both_stores!(bad_shares_say_why_, bad_shares_say_why);
