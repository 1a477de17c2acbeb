//! The console's endpoint pages through a real login cookie: the list (and its empty state),
//! an endpoint's settings, URLs, replicas and figures with its ready replicas charted as an SVG
//! image; another tenant's is not found. And an instance's page charts its GPUs' utilisation
//! and memory from the hourly telemetry rollup.

use gpurent_store::Backend;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;
use crate::console_support::{
    assert_secure_headers, assert_translated, login, untranslated, Console, Page,
};

/// An SVG chart answering an `img`: its type, a document that loads nothing, and a drawing.
#[track_caller]
fn assert_svg(what: &str, svg: &Page) {
    assert_eq!(svg.status, StatusCode::OK, "{what}: {}", svg.html);
    assert_eq!(svg.header(CONTENT_TYPE.as_str()), "image/svg+xml", "{what}");
    assert_eq!(
        svg.header("content-security-policy"),
        "default-src 'none'; frame-ancestors 'none'",
        "{what}"
    );
    assert!(svg.html.starts_with("<svg"), "{what}: {}", svg.html);
    assert!(
        !svg.html.contains("<script") && !svg.html.contains("style="),
        "{what}: {}",
        svg.html
    );
}

/// The page in zh-CN, with no English left but the endpoint's name (in the title: data).
async fn assert_chinese(console: &Console, path: &str) {
    let page = console.get(&format!("{path}?lang=zh-CN")).await;
    assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.html);
    assert!(page.html.contains("<html lang=\"zh-CN\">"), "{path}");
    let english: Vec<String> = untranslated(&page.html)
        .into_iter()
        .filter(|w| w != "web")
        .collect();
    assert!(
        english.is_empty(),
        "{path}: untranslated {english:?}:\n{}",
        page.html
    );
}

/// The usual not-found page of the console (not the API's JSON).
#[track_caller]
fn assert_not_found(what: &str, page: &Page) {
    assert_eq!(page.status, StatusCode::NOT_FOUND, "{what}: {}", page.html);
    page.assert_has("<html lang=\"en\">");
    page.assert_has("Not found");
}

async fn endpoints_are_listed_shown_and_charted(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    // A node of one RTX 4090 with no agent: a replica placed there waits `pending`.
    let (agent, idle) = app.node_by_hand("box").await;
    let (status, answer) = agent.post("/api/v1/agent/sync", &idle).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let alice = app.tenant("alice", "100").await;
    let bob = app.tenant("bob", "100").await;
    let console = login(&app, &alice, "alice").await;
    let other = login(&app, &bob, "bob").await;

    // None yet: how to make one, and the navigation leads here.
    let empty = console.get("/endpoints").await;
    assert_eq!(empty.status, StatusCode::OK, "{}", empty.html);
    assert_secure_headers(&empty);
    empty.assert_has("data-field=\"no-endpoints\"");
    empty.assert_has("gpurent endpoints create NAME --gpu TYPE --image IMG --port 8000");
    empty.assert_has("<a href=\"/endpoints\" aria-current=\"page\">Endpoints</a>");
    assert_translated(&console.get("/endpoints?lang=zh-CN").await);

    let (status, made) = alice
        .client
        .post(
            "/api/v1/endpoints",
            &json!({"name": "web", "gpu_type": "rtx4090", "command": ["app"], "port": 8000}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");

    // The list: linked to its page, with its status, replicas and the URL at the host the
    // console was reached at (as the API answers a client there).
    let list = console.get("/endpoints").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.html);
    list.assert_has("<tr data-endpoint=\"web\">");
    list.assert_has("href=\"/endpoints/web\"");
    list.assert_has("data-status=\"idle\"");
    list.assert_has("<td data-field=\"replicas\">0 / 0</td>");
    let url = made["url"].as_str().unwrap();
    assert!(url.ends_with("/e/web"), "{made}");
    list.assert_has(&format!(">{url}<"));
    assert_translated(&console.get("/endpoints?lang=zh-CN").await);

    // Its page: settings, URLs, figures, no replica yet, and the chart as an image.
    let path = "/endpoints/web";
    let page = console.get(path).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    assert_secure_headers(&page);
    page.assert_has("<dd data-field=\"port\">8000</dd>");
    page.assert_has("<dd data-field=\"command\"><code translate=\"no\">app</code></dd>");
    page.assert_has("1 × <code translate=\"no\">");
    page.assert_has("<dd data-field=\"scaling\">0 – 4</dd>");
    page.assert_has(&format!(
        "<dd data-field=\"url\"><code translate=\"no\">{url}</code>"
    ));
    page.assert_has(made["app_url"].as_str().unwrap());
    page.assert_has("<dd data-field=\"requests\">0</dd>");
    page.assert_has("<img src=\"/endpoints/web/replicas.svg\" data-chart=\"replicas\"");
    assert_chinese(&console, "/endpoints/web").await;
    let svg = console.get("/endpoints/web/replicas.svg").await;
    assert_svg("the replicas chart", &svg);
    assert!(svg.html.contains("Ready replicas"), "{}", svg.html);

    // A replica kept running: its reservation, linked to its instance page.
    let (status, changed) = alice
        .client
        .patch("/api/v1/endpoints/web", &json!({"min_replicas": 1}))
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    let replica = replica_of(&app, &alice.client).await;
    let id = replica["id"].as_str().unwrap();
    let page = console.get(path).await;
    page.assert_has("<tr data-replica=\"1\">");
    page.assert_has(&format!("href=\"/instances/{id}\""));
    page.assert_has("<td data-field=\"ready\">no</td>");
    assert_chinese(&console, "/endpoints/web").await;
    assert_eq!(
        console.get(&format!("/instances/{id}")).await.status,
        StatusCode::OK
    );

    // Another tenant's endpoint is not there: not its page, not its chart, not in the list.
    for path in [
        "/endpoints/web",
        "/endpoints/web/replicas.svg",
        "/endpoints/nothing",
    ] {
        assert_not_found(path, &other.get(path).await);
    }
    let theirs = other.get("/endpoints").await;
    theirs.assert_has("data-field=\"no-endpoints\"");
    assert!(!theirs.html.contains("/endpoints/web"), "{}", theirs.html);
    app.shutdown().await;
}
both_stores!(endpoint_pages, endpoints_are_listed_shown_and_charted);

/// The endpoint's first replica once the scaler has started it.
async fn replica_of(app: &TestApp, client: &Client) -> Value {
    app.eventually("a replica starts", || async {
        let (_, e) = client.get("/api/v1/endpoints/web").await;
        e["replicas"].get(0).is_some()
    })
    .await;
    let (_, e) = client.get("/api/v1/endpoints/web").await;
    e["replicas"][0].clone()
}

async fn an_instance_charts_its_gpus(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (agent, idle) = app.node_by_hand("box").await;
    let (status, answer) = agent.post("/api/v1/agent/sync", &idle).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let tia = app.tenant("tia", "100").await;
    let ann = app.tenant("ann", "100").await;
    let (status, r) = tia
        .client
        .reserve(
            json!({"gpu_type": "RTX 4090", "hours": 1, "command": ["sleep", "600"],
            "http_ports": [8888]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let (_, answer) = agent.post("/api/v1/agent/sync", &idle).await;
    let epoch = answer["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["reservation_id"] == id.as_str())
        .unwrap_or_else(|| panic!("{id} is assigned: {answer}"))["epoch"]
        .as_i64()
        .unwrap();
    // It runs, and its GPU reports 40 % busy with 2 GiB used.
    let sample = json!({"uuid": "GPU-box-0", "utilization_pct": 40, "memory_used_mb": 2048,
        "temperature_c": 50, "power_mw": 200_000, "ecc_uncorrected": 0,
        "memory_total_mb": 24564, "processes": []});
    let (status, answer) = agent
        .post(
            "/api/v1/agent/sync",
            &json!({"gpus": idle["gpus"], "instances": [{"reservation_id": id, "epoch": epoch,
                "state": "running", "exit_code": null}],
                "telemetry": {"gpus": [sample]}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.wait_status(&tia.client, &id, "running").await;
    // The samples are added up in memory and written once a minute; a report writes them first.
    let today = chrono::Utc::now().format("%Y-%m-%d");
    let (status, day) = app
        .admin()
        .get(&format!("/api/v1/reports/daily?date={today}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{day}");

    let (status, usage) = tia
        .client
        .get(&format!("/api/v1/reservations/{id}/gpu-usage"))
        .await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    assert_eq!(usage["shared"], false, "{usage}");
    let hours = usage["hours"].as_array().unwrap();
    assert_eq!(hours.len(), 1, "{usage}");
    assert_eq!(
        (
            &hours[0]["gpu"],
            &hours[0]["utilization_pct"],
            &hours[0]["memory_used_mb"]
        ),
        (&json!("GPU-box-0"), &json!(40.0), &json!(2048.0)),
        "{usage}"
    );

    let console = login(&app, &tia, "tia").await;
    let page = console.get(&format!("/instances/{id}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    page.assert_has(&format!(
        "<img src=\"/instances/{id}/gpu.svg\" data-chart=\"gpu\""
    ));
    // Its published port, linked (the page asks the API at the host it was reached at).
    page.assert_has(&format!("href=\"/instances/{id}/ports/8888\""));
    assert_translated(&console.get(&format!("/instances/{id}?lang=zh-CN")).await);
    let svg = console.get(&format!("/instances/{id}/gpu.svg")).await;
    assert_svg("the GPU chart", &svg);
    assert!(svg.html.contains("Utilisation (%)"), "{}", svg.html);
    assert!(!svg.html.contains("No samples yet"), "{}", svg.html);

    // Not another tenant's: neither the chart nor its figures.
    let theirs = login(&app, &ann, "ann").await;
    assert_not_found(
        "the chart",
        &theirs.get(&format!("/instances/{id}/gpu.svg")).await,
    );
    let (status, _) = ann
        .client
        .get(&format!("/api/v1/reservations/{id}/gpu-usage"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.shutdown().await;
}
both_stores!(instance_gpu_chart, an_instance_charts_its_gpus);
