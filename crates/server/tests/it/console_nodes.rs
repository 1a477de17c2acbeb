//! The console's nodes page and the host's own cordon, drain and uncordon: a host sees its
//! nodes (an admin all) with each GPU's figures as the API gives them, drains, cordons and
//! uncordons its node from the page, gets a join token shown once with the agent's command,
//! and its earnings per node and month; another host's node is a 404 through the API and the
//! page alike, and a tenant may not open the page; in Chinese too.

use chrono::Duration;
use gpurent_agent::gpu::{FakeNvml, Faults};
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::{assert_translated, login, login_admin};

async fn a_host_schedules_only_its_own_nodes(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    let hank = app.user("hank", "host", "0").await;
    let hera = app.user("hera", "host", "0").await;
    app.add_node_owned(&hank.client, "hank-box", "1xRTX4090")
        .await;
    app.add_node_owned(&hera.client, "hera-box", "1xRTX4090")
        .await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let id_of = |name: &str| {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (hank_id, hera_id) = (id_of("hank-box"), id_of("hera-box"));
    for action in ["cordon", "drain", "uncordon"] {
        // Its own, by name and by id: done.
        for node in ["hank-box", hank_id.as_str()] {
            let (status, body) = hank
                .client
                .post(&format!("/api/v1/nodes/{node}/{action}"), &json!({}))
                .await;
            assert_eq!(status, StatusCode::OK, "{action} {node}: {body}");
            assert_eq!(body["node_id"], json!(hank_id));
        }
        // Another host's, by name or id: as if it did not exist.
        for node in ["hera-box", hera_id.as_str()] {
            let (status, body) = hank
                .client
                .post(&format!("/api/v1/nodes/{node}/{action}"), &json!({}))
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{action} {node}: {body}");
            assert_eq!(body["error"]["code"], "not_found");
        }
    }
    assert_eq!(app.node_status("hera-box").await, "ready");
    // An admin still schedules any node.
    let (status, body) = app
        .admin()
        .post("/api/v1/nodes/hera-box/cordon", &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(app.node_status("hera-box").await, "draining");
    let tina = app.tenant("tina", "1").await;
    let (status, _) = tina
        .client
        .post("/api/v1/nodes/hank-box/cordon", &json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    app.shutdown().await;
}
both_stores!(own_nodes_only, a_host_schedules_only_its_own_nodes);

async fn nodes_page_for_hosts_and_admins(backend: Backend) {
    // The manual clock starts on 2026-03-01 12:00 UTC.
    let mut app = TestApp::with(backend).with_manual_clock().start().await;
    let hank = app.user("hank", "host", "0").await;
    let hera = app.user("hera", "host", "0").await;
    app.add_node_owned(&hank.client, "hank-box", "2xRTX4090")
        .await;
    app.add_node_owned(&hera.client, "hera-box", "1xRTX4090")
        .await;
    // Something earned on hank's node this month.
    let tess = app.tenant("tess", "100").await;
    let (status, r) = tess
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 2}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&tess.client, &id, "running").await;
    app.advance(Duration::seconds(90));
    app.maintenance_tick().await;
    tess.client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    app.wait_status(&tess.client, &id, "stopped").await;
    app.wait_nodes_ready().await;

    let host = login(&app, &hank, "hank").await;
    let page = host.get("/nodes").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    let (_, nodes) = hank.client.get("/api/v1/nodes").await;
    let node = &nodes[0];
    let node_id = node["id"].as_str().unwrap().to_owned();
    page.assert_has(&format!("data-node-id=\"{node_id}\""));
    assert!(!page.html.contains("hera-box"), "another host's node");
    page.assert_has("id=\"nodes\" data-live=\"2000\"");
    page.assert_has("data-field=\"node-status\" data-status=\"ready\"");
    // The cores its agent reported (this host's), on the page as in the API.
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(node["cpus"], cores, "{node}");
    page.assert_has(&format!("data-field=\"capacity\">{cores} cores"));
    for gpu in node["gpus"].as_array().unwrap() {
        page.assert_has(&format!(
            "data-gpu-uuid=\"{}\"",
            gpu["uuid"].as_str().unwrap()
        ));
        let t = &gpu["telemetry"];
        assert!(t.is_object(), "the sim agent reports figures: {node}");
        page.assert_has(&format!(
            "data-field=\"temperature\" data-label=\"Temperature\">{} °C",
            t["temperature_c"]
        ));
        page.assert_has(&format!(
            "data-field=\"memory\" data-label=\"Memory\">{} / {} MiB",
            t["memory_used_mb"], t["memory_total_mb"]
        ));
        page.assert_has(&format!("value=\"{}\"", t["utilization_pct"]));
    }
    // Earnings per node and month: this month's column has what the API says.
    let (_, earned) = hank
        .client
        .get("/api/v1/earnings?from=2026-03-01&to=2026-04-01")
        .await;
    let amount = earned["nodes"][0]["earned"].as_str().unwrap().to_owned();
    assert_ne!(amount, "0.00", "{earned}");
    page.assert_has("<th scope=\"col\">2026-01</th><th scope=\"col\">2026-02</th><th scope=\"col\">2026-03</th>");
    page.assert_has(&format!(
        "<tr data-node=\"hank-box\"><th scope=\"row\"><code translate=\"no\">hank-box</code></th><td><span class=\"money\">0.00 USD</span></td><td><span class=\"money\">0.00 USD</span></td><td><span class=\"money\">{amount} USD</span></td>"
    ));
    // The live refresh (console.js, every 2 s) has the nodes, not the earnings.
    let live = host.get_with("/nodes", &[("x-gpurent-live", "1")]).await;
    live.assert_has(&format!("data-node-id=\"{node_id}\""));
    assert!(
        !live.html.contains("<tr data-node=\"hank-box\">"),
        "{}",
        live.html
    );
    let february = host.get("/nodes?month=2026-02").await;
    february.assert_has("<th scope=\"col\">2026-02</th></tr>");
    february.assert_has("<tr data-node=\"hank-box\">");
    assert!(!february.html.contains(&format!("{amount} USD")));
    let bad = host.get("/nodes?month=soon").await;
    assert_eq!(bad.status, StatusCode::OK);
    bad.assert_has("month: &quot;soon&quot; is not YYYY-MM");

    // Drain from the page, then uncordon; every form carries its CSRF token.
    let forged = host
        .post_raw(&format!("/nodes/{node_id}/drain"), &[], &[])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert_eq!(app.node_status("hank-box").await, "ready");
    let drained = host.post(&format!("/nodes/{node_id}/drain"), &[]).await;
    assert_eq!(drained.status, StatusCode::SEE_OTHER, "{}", drained.html);
    assert_eq!(app.node_status("hank-box").await, "draining");
    let page = host.get(drained.location().unwrap()).await;
    page.assert_has("data-field=\"node-status\" data-status=\"draining\"");
    page.assert_has("data-action=\"uncordon\"");
    let back = host.post(&format!("/nodes/{node_id}/uncordon"), &[]).await;
    assert_eq!(back.status, StatusCode::SEE_OTHER);
    assert_eq!(app.node_status("hank-box").await, "ready");
    let cordoned = host.post("/nodes/hank-box/cordon", &[]).await;
    assert_eq!(cordoned.status, StatusCode::SEE_OTHER);
    assert_eq!(app.node_status("hank-box").await, "draining");
    // Another host's node: a 404 page, and the node untouched.
    let foreign = host.post("/nodes/hera-box/drain", &[]).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
    assert_eq!(app.node_status("hera-box").await, "ready");

    // A join token, shown once with the agent's command.
    let joined = host.post("/nodes", &[]).await;
    assert_eq!(joined.status, StatusCode::OK, "{}", joined.html);
    let at = joined
        .html
        .find("data-field=\"token\">")
        .expect("the token")
        + 19;
    let token = joined.html[at..].split('<').next().unwrap().to_owned();
    assert!(token.starts_with("gpj_"), "{token}");
    joined.assert_has(&format!("--join-token {token}"));
    joined.assert_has("gpurent agent --server http://");
    joined.assert_has(&format!("data-copy=\"{token}\""));
    assert!(!host.get("/nodes").await.html.contains(&token));

    // Chinese, with the figures and a join token on the page.
    assert_translated(&host.get("/nodes?lang=zh-CN").await);
    assert_translated(&host.post("/nodes?lang=zh-CN", &[]).await);

    // An admin sees every node and its owner; a tenant may not open the page.
    let admin = login_admin(&app).await;
    let all = admin.get("/nodes").await;
    all.assert_has("hank-box");
    all.assert_has("hera-box");
    all.assert_has(&hank.id);
    // The owners' earnings, hank's among them.
    all.assert_has(&format!("{amount} USD"));
    assert_translated(&admin.get("/nodes?lang=zh-CN").await);
    let tenant = login(&app, &tess, "tess").await;
    assert_eq!(tenant.get("/nodes").await.status, StatusCode::FORBIDDEN);
    assert_eq!(
        tenant
            .post(&format!("/nodes/{node_id}/uncordon"), &[])
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    app.shutdown().await;
}
both_stores!(nodes_page, nodes_page_for_hosts_and_admins);

async fn a_hot_gpu_on_the_nodes_page(backend: Backend) {
    // A real H200's figures (the fake NVML replays one), then a breach of the heat rule.
    let mut app = TestApp::with(backend).start().await;
    let probe = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/nvidia-h200/nvml-idle.json");
    let gpus = std::sync::Arc::new(FakeNvml::load(&probe).expect("fixture"));
    app.add_node_with("h200-box", gpus.clone()).await;
    gpus.inject(Faults {
        temperature_c: Some(91),
        ..Faults::default()
    });
    let node = || async { app.admin().get("/api/v1/nodes").await.1[0].clone() };
    // Health and telemetry travel in different reports: wait for both to show the fault, so
    // the page and the API below describe the same state.
    app.eventually("the node to be unhealthy and report 91 °C", || async {
        let n = node().await;
        n["status"] == "unhealthy" && n["gpus"][0]["telemetry"]["temperature_c"] == 91
    })
    .await;
    let admin = login_admin(&app).await;
    let node = node().await;
    let page = admin.get("/nodes").await;
    page.assert_has("data-field=\"node-status\" data-status=\"unhealthy\"");
    let issue = &node["health"][0];
    assert_eq!(issue["rule"], "temperature", "{node}");
    page.assert_has(&format!(
        "<li class=\"error\">temperature <code translate=\"no\">{}</code> <code translate=\"no\">{}</code></li>",
        issue["gpu_uuid"].as_str().unwrap(),
        issue["detail"].as_str().unwrap()
    ));
    // The driver's versions, and each GPU's figures as the agent reported them.
    let driver = node["driver_version"].as_str().expect("the H200's driver");
    page.assert_has(&format!("<code translate=\"no\">{driver}</code>"));
    let cuda = node["cuda_version"].as_str().expect("its CUDA");
    page.assert_has(&format!("<code translate=\"no\">CUDA {cuda}</code>"));
    for gpu in node["gpus"].as_array().unwrap() {
        let t = &gpu["telemetry"];
        let mw = t["power_mw"].as_u64().unwrap();
        assert!(mw > 0, "a real GPU draws power: {t}");
        page.assert_has(&format!(
            "data-field=\"power\" data-label=\"Power\">{}.{} W",
            mw / 1000,
            (mw % 1000) / 100
        ));
        page.assert_has(&format!(
            "data-field=\"temperature\" data-label=\"Temperature\">{} °C",
            t["temperature_c"]
        ));
        page.assert_has(&format!(
            "data-field=\"memory\" data-label=\"Memory\">{} / {} MiB",
            t["memory_used_mb"], t["memory_total_mb"]
        ));
    }
    let zh = admin.get("/nodes?lang=zh-CN").await;
    zh.assert_has("温度 <code");
    assert_translated(&zh);
    app.shutdown().await;
}
both_stores!(hot_gpu_page, a_hot_gpu_on_the_nodes_page);
