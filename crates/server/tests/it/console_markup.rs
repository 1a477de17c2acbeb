//! Markup in every string a host's agent supplies (GPU UUIDs and models, a MIG profile, the
//! executor and backend names, driver, CUDA and toolkit versions, a burn-in failure, a watchdog
//! event, an instance's output and end message) is text on every console page, never markup.

use gpurent_server::HostPolicy;
use gpurent_store::Backend;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;
use crate::console_support::{self, login_admin, Console, Page};

/// What a hostile host puts in a field: a script, an attribute breaking out into an
/// `<img onerror>`, the end of a `<textarea>`, a `javascript:` URL. `field` names where it went.
fn payload(field: &str) -> String {
    format!(
        "{field}:<script>window.__pwned=1</script>\"><img src=x onerror=alert(1)></textarea>javascript:alert(1)"
    )
}

/// The same for fields without spaces (GPU UUIDs).
fn payload_without_spaces(field: &str) -> String {
    format!("{field}:<script>window.__pwned=1</script>\"><img/src=x/onerror=alert(1)>")
}

/// What must never reach a page as it was sent.
const RAW: [&str; 4] = [
    "<script>window.__pwned",
    "<img src=x",
    "<img/src=x",
    "</textarea>javascript:",
];

/// Text as maud writes it in an element or an attribute.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[track_caller]
fn assert_no_markup(what: &str, page: &Page) {
    for raw in RAW {
        assert!(
            !page.html.contains(raw),
            "{what} shows {raw:?} unescaped:\n{}",
            page.html
        );
    }
    assert!(
        !page.html.contains("=\"javascript:") && !page.html.contains("='javascript:"),
        "{what} has a javascript: attribute:\n{}",
        page.html
    );
}

/// The agent's next answered sync with `body`.
async fn sync(agent: &Client, body: Value) -> Value {
    let (status, answer) = agent.post("/api/v1/agent/sync", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer
}

/// Reserves the node's RTX 4090 for the tenant; (its id, its epoch) once the agent has it.
async fn reserve(tenant: &Client, agent: &Client) -> (String, i64) {
    let (status, r) = tenant
        .reserve(json!({"gpu_type": "RTX 4090", "hours": 1, "command": ["sleep", "600"]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let answer = sync(agent, json!({"gpus": [], "instances": []})).await;
    let assigned = answer["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["reservation_id"] == id.as_str())
        .unwrap_or_else(|| panic!("{id} is assigned: {answer}"))
        .clone();
    (id, assigned["epoch"].as_i64().unwrap())
}

/// The pages a user of this console may open, with the facts of this test in their paths.
fn pages(role: &str, instances: &[&str], today: &str) -> Vec<String> {
    let mut paths: Vec<String> = [
        "/offers",
        "/offers/quote?gpu_type=RTX+4090&hours=1",
        "/instances",
        "/endpoints",
        "/billing",
        "/account",
    ]
    .map(String::from)
    .into();
    if role != "tenant" {
        paths.push("/nodes".into());
    }
    if role == "admin" {
        for p in [
            "/admin",
            "/admin/users",
            "/admin/reservations",
            "/admin/events",
            "/admin/audit",
            "/admin/audit/verify",
            "/admin/ledger",
        ] {
            paths.push(p.into());
        }
        paths.push(format!("/admin/reports?date={today}"));
        paths.push(format!("/admin/reports/heatmap.svg?date={today}"));
        paths.push(format!("/admin/reports/timeline.svg?date={today}"));
    }
    if role != "host" {
        for id in instances {
            paths.push(format!("/instances/{id}"));
            paths.push(format!("/instances/{id}/gpu.svg"));
        }
    }
    paths
}

/// Every page of each viewer, in both languages: no payload unescaped.
async fn every_page(who: &[(&str, &Console)], instances: &[&str]) -> Vec<(String, Page)> {
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let mut shown = Vec::new();
    for (role, console) in who {
        for path in pages(role, instances, &today) {
            for lang in ["en", "zh-CN"] {
                let sep = if path.contains('?') { '&' } else { '?' };
                let at = format!("{path}{sep}lang={lang}");
                let page = console.get(&at).await;
                assert_eq!(page.status, StatusCode::OK, "{role} {at}: {}", page.html);
                assert!(
                    !page.header("content-security-policy").contains("unsafe-"),
                    "{role} {at}: {}",
                    page.header("content-security-policy")
                );
                assert_no_markup(&format!("{role}'s {at}"), &page);
                shown.push((format!("{role} {at}"), page));
            }
        }
    }
    shown
}

/// A host's agent reports markup in every field it may fill; the console shows it as text.
async fn markup_from_an_agent_is_text_on_every_page(backend: Backend) {
    // A driver and CUDA too old: the verification's details show what the host reported.
    let app = TestApp::with(backend)
        .with_host_policy(HostPolicy {
            min_driver: Some("550".into()),
            min_cuda: Some("12.4".into()),
            min_disk_free_gb: 10,
        })
        .start()
        .await;
    let hal = app.user("hal", "host", "0").await;
    let tia = app.tenant("tia", "100").await;
    let (status, join) = hal
        .client
        .post("/api/v1/nodes/join-token", &json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{join}");

    let uuid = payload_without_spaces("uuid");
    let gpus = json!([
        {"index": 0, "uuid": uuid, "model": "NVIDIA GeForce RTX 4090", "vram_mb": 24564},
        {"index": 1, "uuid": "GPU-model", "model": payload("model"), "vram_mb": 24564},
        {"index": 2, "uuid": "MIG-profile", "model": format!("NVIDIA H200 MIG 3g.71gb {}", payload("mig")),
         "vram_mb": 72_000},
    ]);
    let register = |name: &str| {
        json!({"join_token": join["token"], "name": name, "executor": payload("executor"),
               "gpu_backend": payload("backend"), "gpus": gpus})
    };
    // A node's name is letters, digits and - _ . only.
    let (status, refused) = app
        .anonymous()
        .post("/api/v1/agent/register", &register(&payload("name")))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("name must be"),
        "{refused}"
    );
    let (status, node) = app
        .anonymous()
        .post("/api/v1/agent/register", &register("hostile"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    let agent = app.client(node["node_token"].as_str());
    sync(&agent, json!({"gpus": gpus, "instances": []})).await;

    // One instance fails with the host's words and its output; the next runs.
    let (failed, epoch) = reserve(&tia.client, &agent).await;
    let output = format!("{}\n", payload("log"));
    sync(
        &agent,
        json!({"gpus": [], "instances": [{"reservation_id": failed, "epoch": epoch,
            "state": "failed", "exit_code": 1, "message": payload("end_message")}],
            "logs": [{"reservation_id": failed, "epoch": epoch, "offset": 0,
            "length": output.len(), "data": output}]}),
    )
    .await;
    app.wait_status(&tia.client, &failed, "failed").await;
    let (running, epoch) = reserve(&tia.client, &agent).await;
    sync(
        &agent,
        json!({"gpus": [], "instances": [{"reservation_id": running, "epoch": epoch,
            "state": "running", "exit_code": null, "message": payload("running_message")}]}),
    )
    .await;
    app.wait_status(&tia.client, &running, "running").await;

    // Then its host's facts, a sample with a failed burn-in, and a watchdog event.
    let sample = json!({"uuid": uuid, "utilization_pct": 50, "memory_used_mb": 1000,
        "temperature_c": 60, "power_mw": 200_000, "ecc_uncorrected": 0,
        "memory_total_mb": 24564, "processes": []});
    sync(
        &agent,
        json!({"gpus": gpus, "instances": [],
            "host": {"driver_version": payload("host_driver"), "cuda_version": payload("host_cuda"),
                "container_toolkit": payload("toolkit"), "gpu_containers": true,
                "disk_free_mb": 100_000, "isolated": true, "cpus": 8, "memory_mb": 65536},
            "telemetry": {"driver_version": payload("driver"), "cuda_version": payload("cuda"),
                "gpus": [sample], "burn_in": {"running": false, "failed": payload("burn_in")}},
            "events": [{"kind": "vram_over_share", "reservation_id": running,
                "gpu_uuid": uuid, "detail": payload("event")}]}),
    )
    .await;

    let tenant = console_support::login(&app, &tia, "tia").await;
    let host = console_support::login(&app, &hal, "hal").await;
    let admin = login_admin(&app).await;
    let shown = every_page(
        &[("tenant", &tenant), ("host", &host), ("admin", &admin)],
        &[&failed, &running],
    )
    .await;

    // The instance's output is served as text, never as a page.
    let log = tenant.get(&format!("/instances/{failed}/log")).await;
    assert_eq!(log.status, StatusCode::OK);
    assert_eq!(
        log.header(CONTENT_TYPE.as_str()),
        "text/plain; charset=utf-8"
    );
    assert_eq!(log.header("x-content-type-options"), "nosniff");
    assert!(log.html.contains(&payload("log")), "{}", log.html);

    // Where each field is shown, it is shown escaped.
    let on = |page: &str, field: &str, text: &str| {
        let (_, p) = shown
            .iter()
            .find(|(at, _)| at.starts_with(page))
            .unwrap_or_else(|| panic!("no page {page}"));
        assert!(
            p.html.contains(&escaped(text)),
            "{page} shows {field} escaped:\n{}",
            p.html
        );
    };
    for viewer in ["tenant", "admin"] {
        for lang in ["en", "zh-CN"] {
            let page = format!("{viewer} /instances/{failed}?lang={lang}");
            on(&page, "the end message", &payload("end_message"));
        }
    }
    for viewer in ["host", "admin"] {
        for lang in ["en", "zh-CN"] {
            let nodes = format!("{viewer} /nodes?lang={lang}");
            for field in [
                "executor",
                "backend",
                "driver",
                "cuda",
                "host_driver",
                "host_cuda",
                "burn_in",
            ] {
                on(&nodes, field, &payload(field));
            }
            on(&nodes, "uuid", &uuid);
            // Models are shown as their GPU type, which keeps letters, digits, dots and dashes.
            on(
                &nodes,
                "model",
                "MODEL-SCRIPT-WINDOW.-PWNED-1-SCRIPT-IMG-SRC-X",
            );
            on(
                &nodes,
                "MIG profile",
                "H200-MIG-3G.71GB-MIG-SCRIPT-WINDOW.-PWNED-1",
            );
        }
    }
    for page in [
        "admin /admin/events?lang=en",
        "admin /admin/events?lang=zh-CN",
    ] {
        on(page, "the event", &payload("event"));
        on(page, "the burn-in failure", &payload("burn_in"));
    }
    on(
        "admin /admin?lang=en",
        "the burn-in failure",
        &payload("burn_in"),
    );
    on("admin /admin/audit?lang=en", "uuid", &uuid);
    app.shutdown().await;
}
both_stores!(agent_markup, markup_from_an_agent_is_text_on_every_page);
