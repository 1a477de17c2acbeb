//! Endpoints through a real control plane and a simulated agent whose replicas are real HTTP
//! servers on loopback: scale 0 → 1 on the first request, 1 → N under concurrency, N → 0
//! after idle; keys; both URL forms; the queue's limits (429, 503 with `Retry-After`, a client
//! that leaves while queued); an app's 500 passed through; bad input refused.

use std::collections::HashSet;

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::both_stores;
use crate::endpoints_support::setup;

async fn an_endpoint_scales_from_zero_to_many_and_back(backend: Backend) {
    let s = setup(backend).await;
    let e = s
        .create(
            "llm",
            json!({"APP_TAG": "v1"}),
            json!({"max_replicas": 3, "target_inflight": 1, "scale_down_after_s": 1}),
        )
        .await;
    assert_eq!(e["status"], "idle");
    assert_eq!(e["replicas"], json!([]));
    assert!(
        e["app_url"]
            .as_str()
            .unwrap()
            .starts_with("http://llm.e.localhost:"),
        "{e}"
    );
    let key = s.key("llm").await;

    // No key, a wrong one: refused, and nothing starts.
    assert_eq!(s.call("llm", "/x", "").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        s.call("llm", "/x", "gpe_0000").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert!(s.replicas("llm").await.is_empty());

    // 0 → 1: the first request waits for a replica and is answered by it.
    let (status, body) = s.call("llm", "/work?ms=10", &key).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["tag"], "v1");
    assert_eq!(answer["path"], "/work");
    let first = answer["replica"].as_str().unwrap().to_owned();
    let got = s.get("llm").await;
    assert_eq!(got["status"], "ready", "{got}");
    assert_eq!(got["ready_replicas"], 1, "{got}");
    assert_eq!(got["replicas"][0]["id"], first.as_str(), "{got}");
    assert!(got["url"].as_str().unwrap().ends_with("/e/llm"), "{got}");
    assert_eq!(got["cold_starts"], 1, "{got}");
    assert!(got["cold_start_p50_ms"].as_f64().unwrap() > 0.0);
    // /metrics has its series, by name.
    let metrics = s
        .http
        .get(format!("{}/metrics", s.app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        "gpurent_endpoint_requests_total{endpoint=\"llm\"}",
        "gpurent_endpoint_replicas{endpoint=\"llm\",state=\"ready\"} 1",
        "gpurent_endpoint_cold_starts_total{endpoint=\"llm\"} 1",
        "gpurent_endpoint_latency_seconds{endpoint=\"llm\",quantile=\"0.99\"}",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    // The replica is a reservation of its endpoint, in `ls`.
    let (_, list) = s.client().get("/api/v1/reservations").await;
    let replica = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == first.as_str())
        .cloned()
        .unwrap();
    assert_eq!(replica["endpoint"], "llm");
    assert_eq!(replica["endpoint_replica"], 1);
    assert_eq!(replica["status"], "running");

    // The apps' site: NAME.e.localhost, same answer.
    let port = s.app.base.rsplit(':').next().unwrap().to_owned();
    let r = s
        .http
        .get(format!("http://127.0.0.1:{port}/work"))
        .header("host", format!("llm.e.localhost:{port}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("content-security-policy").is_none());
    // The path form is sandboxed.
    let r = s
        .http
        .get(format!("{}/e/llm/work", s.app.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-security-policy"], "sandbox");

    // 1 → N: eight slow requests at once against a target of one each.
    let calls = (0..8).map(|_| s.call("llm", "/work?ms=1500", &key));
    let answers = futures::future::join_all(calls).await;
    let mut replicas = HashSet::new();
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::OK, "{body}");
        let a: Value = serde_json::from_str(body).unwrap();
        replicas.insert(a["replica"].as_str().unwrap().to_owned());
    }
    assert!(replicas.len() >= 2, "answered by {replicas:?}");
    assert!(s.replicas("llm").await.len() <= 3);

    // N → 0 once idle past scale_down_after_s.
    s.app
        .eventually("the endpoint to scale to zero", || async {
            s.replicas("llm").await.is_empty() && s.executor.serving() == 0
        })
        .await;
    let got = s.get("llm").await;
    assert_eq!(got["status"], "idle", "{got}");
    assert!(got["requests"].as_u64().unwrap() >= 10);
    // Billing: each replica is charged for exactly the whole seconds it ran, no more.
    let (_, list) = s.client().get("/api/v1/reservations").await;
    let ended: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["endpoint"] == "llm")
        .collect();
    assert!(ended.len() >= 2, "{list}");
    for r in ended {
        assert_eq!(r["status"], "stopped", "{r}");
        let at = |k: &str| {
            chrono::DateTime::parse_from_rfc3339(r[k].as_str().unwrap())
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        let ran = u64::try_from((at("ended_at") - at("started_at")).num_seconds()).unwrap();
        let price: gpurent_types::Money = r["price_per_hour"].as_str().unwrap().parse().unwrap();
        let due = gpurent_billing::Rate::flat(price).charge_for_seconds(ran);
        assert_eq!(r["charged"], due.to_string(), "{r}");
    }
    // And back from zero.
    let (status, body) = s.call("llm", "/work", &key).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    s.app.assert_consistent().await;
}

both_stores!(
    scale_from_zero_and_back,
    an_endpoint_scales_from_zero_to_many_and_back
);

#[tokio::test]
async fn the_queue_is_bounded_and_times_out() {
    let s = setup(Backend::Sqlite).await;
    s.create(
        "slow",
        json!({"APP_HEALTH": "never"}),
        json!({"max_replicas": 1, "queue_timeout_s": 2, "max_queue": 2, "public": true}),
    )
    .await;
    let url = format!("{}/e/slow/x", s.app.base);
    let wait = |url: String| {
        let http = s.http.clone();
        tokio::spawn(async move { http.get(url).send().await.unwrap() })
    };
    let first = wait(url.clone());
    let second = wait(url.clone());
    s.app
        .eventually("two requests to wait", || async {
            s.get("slow").await["queued"] == 2
        })
        .await;
    // Past max_queue: 429 at once.
    let third = s.http.get(&url).send().await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(third.headers().contains_key("retry-after"));
    // The queue's timeout: 503 with Retry-After and why.
    for waited in [first, second] {
        let r = waited.await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().contains_key("retry-after"));
        let body: Value = r.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("was ready within 2 s"), "{message}");
    }
    // A client that leaves while queued frees its place.
    let gone = wait(url.clone());
    s.app
        .eventually("a request to wait", || async {
            s.get("slow").await["queued"] == 1
        })
        .await;
    gone.abort();
    s.app
        .eventually("its place to be freed", || async {
            s.get("slow").await["queued"] == 0
        })
        .await;
}

#[tokio::test]
async fn answers_pass_through_and_bad_input_is_refused() {
    let s = setup(Backend::Sqlite).await;
    s.create(
        "api",
        json!({}),
        json!({"public": true, "max_body_mb": 1, "min_replicas": 1}),
    )
    .await;
    // min_replicas: one starts with nobody calling.
    s.app
        .eventually("the minimum replica to be ready", || async {
            s.get("api").await["status"] == "ready"
        })
        .await;
    // The app's own 500 is its answer, and nothing scales on it.
    let r = s
        .http
        .get(format!("{}/e/api/fail", s.app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.text().await.unwrap(), "the app failed");
    // A body over the limit: 413 before any replica sees it.
    let r = s
        .http
        .post(format!("{}/e/api/upload", s.app.base))
        .body(vec![0u8; 2 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Server-sent events stream through.
    let r = s
        .http
        .get(format!("{}/e/api/stream", s.app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(r.text().await.unwrap(), "data: 0\n\ndata: 1\n\ndata: 2\n\n");
    assert_eq!(s.replicas("api").await.len(), 1);

    // Bad input, each refused naming the field.
    let bad = [
        (
            json!({"name": "Bad_Name", "gpu_type": "rtx4090", "port": 8000}),
            "name",
        ),
        (
            json!({"name": "api", "gpu_type": "rtx4090", "port": 8000}),
            "name",
        ),
        (
            json!({"name": "x", "gpu_type": "rtx4090", "port": 0}),
            "port",
        ),
        (
            json!({"name": "x", "gpu_type": "rtx4090", "port": 1,
                   "scaling": {"min_replicas": 5, "max_replicas": 2}}),
            "min_replicas",
        ),
        (
            json!({"name": "x", "gpu_type": "rtx4090", "port": 1, "scaling": {"max_replicas": 0}}),
            "max_replicas",
        ),
        (
            json!({"name": "x", "gpu_type": "rtx4090", "port": 1,
                   "scaling": {"health_path": "health"}}),
            "health_path",
        ),
        (
            json!({"name": "x", "gpu_type": "rtx4090", "port": 1, "gpu_count": 1, "vram_gb": 4}),
            "gpu_count",
        ),
    ];
    for (body, field) in bad {
        let (status, e) = s.client().post("/api/v1/endpoints", &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    let (status, _) = s
        .client()
        .post(
            "/api/v1/endpoints",
            &json!({"name": "x", "port": 1, "gpu_type": "rtx4090", "nope": 1}),
        )
        .await;
    assert!(status.is_client_error());
    // Another tenant neither sees nor changes it.
    let other = crate::proxy_support::user(&s.app, "zed").await;
    let (status, _) = s
        .app
        .client(Some(&other))
        .get("/api/v1/endpoints/api")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, list) = s.app.client(Some(&other)).get("/api/v1/endpoints").await;
    assert_eq!(list, json!([]));

    // Removed: its URL stops answering and its replica stops.
    let (status, _, removed) = s
        .client()
        .send("DELETE", "/api/v1/endpoints/api", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(removed["name"], "api");
    s.app
        .eventually("the replica to stop", || async {
            s.executor.serving() == 0
        })
        .await;
    let r = s
        .http
        .get(format!("{}/e/api/x", s.app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_key_of_another_endpoint_is_refused() {
    let s = setup(Backend::Sqlite).await;
    s.create("one", json!({}), json!({})).await;
    s.create("two", json!({}), json!({})).await;
    let key_one = s.key("one").await;
    let (status, body) = s.call("two", "/x", &key_one).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.contains("does not open endpoint two"), "{body}");
    // Listed by prefix, removed, then refused.
    let (_, keys) = s.client().get("/api/v1/endpoints/one/keys").await;
    let id = keys[0]["id"].as_str().unwrap().to_owned();
    assert!(key_one.starts_with(keys[0]["prefix"].as_str().unwrap()));
    let (status, _, _) = s
        .client()
        .send("DELETE", &format!("/api/v1/endpoints/one/keys/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        s.call("one", "/x", &key_one).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert!(s.replicas("one").await.is_empty());
}
