//! `/metrics` on the control plane and on an agent: the figures move with the platform,
//! routes are labelled by template, the text passes `promtool check metrics`, the shipped
//! alert rules pass `promtool check rules`, and the shipped rules and Grafana dashboard use
//! only metrics the endpoints export.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpurent_agent::gpu::FakeNvml;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

/// One sample: its metric name, labels and value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the samples of a text exposition (enough of the format for these tests: quoted
/// label values with `\"`, `\\` and `\n` escapes).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("a value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().expect("a number"),
        };
        let (name, mut rest) = match series.split_once('{') {
            Some((n, r)) => (n, r.strip_suffix('}').expect("closing brace")),
            None => (series, ""),
        };
        let mut labels = BTreeMap::new();
        while !rest.is_empty() {
            let (key, after) = rest.split_once("=\"").expect("label");
            let mut val = String::new();
            let mut chars = after.char_indices();
            let mut end = after.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('n') => val.push('\n'),
                        Some(c) => val.push(c),
                        None => {}
                    },
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => val.push(c),
                }
            }
            labels.insert(key.to_owned(), val);
            rest = after[end..].trim_start_matches(',');
        }
        out.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    out
}

/// The sum of the samples of `name` whose labels include all of `labels`.
fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text)
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

async fn scrape(client: &Client) -> String {
    let (status, text, content_type) = client.get_text("/metrics", "content-type").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(
        content_type
            .as_deref()
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "{content_type:?}"
    );
    text
}

async fn control_plane_metrics_follow_the_platform(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    // No token: like /healthz.
    let text = scrape(&app.anonymous()).await;
    assert_eq!(sum(&text, "gpurent_gpus", &[("state", "free")]), 2.0);
    assert_eq!(sum(&text, "gpurent_gpus", &[("state", "allocated")]), 0.0);
    assert_eq!(sum(&text, "gpurent_nodes", &[("status", "ready")]), 1.0);
    assert_eq!(sum(&text, "gpurent_nodes", &[("status", "lost")]), 0.0);

    let t = app.tenant("mia", "100").await;
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let first = r["id"].as_str().unwrap().to_owned();
    let (status, _) = t.client.get(&format!("/api/v1/reservations/{first}")).await;
    assert_eq!(status, StatusCode::OK);
    // Two GPUs do not fit on the one left: queued.
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 1, "queue": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert!(r["queue_reason"].is_string(), "{r}");
    let queued = r["id"].as_str().unwrap().to_owned();

    let text = scrape(&app.anonymous()).await;
    assert_eq!(sum(&text, "gpurent_gpus", &[("state", "allocated")]), 1.0);
    assert_eq!(sum(&text, "gpurent_gpus", &[("state", "free")]), 1.0);
    // One of two equal GPUs: half the memory.
    let allocated = sum(&text, "gpurent_gpu_memory_bytes", &[("state", "allocated")]);
    assert!(allocated > 0.0);
    assert_eq!(
        allocated,
        sum(&text, "gpurent_gpu_memory_bytes", &[("state", "free")])
    );
    assert_eq!(sum(&text, "gpurent_queue_length", &[]), 1.0);
    assert_eq!(
        sum(
            &text,
            "gpurent_reservations",
            &[("status", "pending"), ("tier", "on-demand")]
        ) + sum(
            &text,
            "gpurent_reservations",
            &[("status", "running"), ("tier", "on-demand")]
        ),
        2.0
    );
    let by_route = |text: &str, route: &str, method: &str| {
        sum(
            text,
            "gpurent_http_request_duration_seconds_count",
            &[("route", route), ("method", method), ("status", "2xx")],
        )
    };
    assert!(by_route(&text, "/api/v1/reservations/{id}", "GET") >= 1.0);
    assert!(by_route(&text, "/api/v1/reservations", "POST") >= 2.0);
    // The agent's syncs are counted as they end: its first may still be on its way.
    let mut text = text;
    for _ in 0..100 {
        if by_route(&text, "/api/v1/agent/sync", "POST") >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        text = scrape(&app.anonymous()).await;
    }
    assert!(by_route(&text, "/api/v1/agent/sync", "POST") >= 1.0);
    // Routes are templates, never paths with ids.
    for s in samples(&text) {
        if let Some(route) = s.labels.get("route") {
            assert!(
                !route.contains(&first) && !route.contains(&queued),
                "{route}"
            );
        }
    }
    // The first reservation was placed at once.
    assert!(sum(&text, "gpurent_reservation_wait_seconds_count", &[]) >= 1.0);
    assert_eq!(
        sum(
            &text,
            "gpurent_reservation_wait_seconds_bucket",
            &[("le", "0.5")]
        ),
        sum(&text, "gpurent_reservation_wait_seconds_count", &[])
    );

    // A 404 is counted under its route's template too.
    let (status, _) = t.client.get("/api/v1/reservations/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let text = scrape(&app.anonymous()).await;
    assert!(
        sum(
            &text,
            "gpurent_http_request_duration_seconds_count",
            &[
                ("route", "/api/v1/reservations/{id}"),
                ("method", "GET"),
                ("status", "4xx")
            ]
        ) >= 1.0
    );

    // The first stops: the queued one is placed, and its wait observed.
    let (status, _) = t
        .client
        .post(&format!("/api/v1/reservations/{first}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    app.wait_status(&t.client, &queued, "running").await;
    let text = scrape(&app.anonymous()).await;
    assert_eq!(sum(&text, "gpurent_gpus", &[("state", "allocated")]), 2.0);
    assert_eq!(sum(&text, "gpurent_queue_length", &[]), 0.0);
    assert!(sum(&text, "gpurent_reservation_wait_seconds_count", &[]) >= 2.0);
    app.shutdown().await;
}

both_stores!(
    control_plane_metrics_follow_the_platform_on,
    control_plane_metrics_follow_the_platform
);

#[tokio::test]
async fn revenue_and_preemptions_are_counted() {
    let app = TestApp::with(Backend::Sqlite)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let t = app.tenant("sam", "100").await;
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "tier": "spot", "bid": "2.00"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let spot = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&t.client, &spot, "running").await;
    app.advance(chrono::Duration::seconds(36));
    app.wait_nodes_ready().await;
    // On-demand work takes the GPU: the spot instance is preempted, billed 36 s at 2.00/h.
    let (status, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    app.wait_status(&t.client, &spot, "preempted").await;
    let text = scrape(&app.anonymous()).await;
    assert_eq!(sum(&text, "gpurent_preemptions_total", &[]), 1.0);
    assert_eq!(sum(&text, "gpurent_revenue_total", &[]), 0.02);
    assert_eq!(sum(&text, "gpurent_host_earnings_total", &[]), 0.016);
    assert_eq!(
        sum(
            &text,
            "gpurent_spot_instances_ended_total",
            &[("outcome", "interrupted")]
        ),
        1.0
    );
    assert_eq!(sum(&text, "gpurent_spot_success_ratio", &[]), 0.0);
    app.shutdown().await;
}

/// The agent's endpoint, served as `gpurent agent --metrics-listen` serves it.
async fn agent_scrape(app: &TestApp, node: &str) -> String {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (addr, task) = gpurent_agent::metrics::serve(
        "127.0.0.1:0".parse().unwrap(),
        app.agent_metrics(node),
        stopped,
    )
    .await
    .unwrap();
    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response
        .headers()
        .get("content-type")
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")));
    let text = response.text().await.unwrap();
    let _ = stop.send(true);
    task.await.unwrap();
    text
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// promtool from Debian's `prometheus` package (scripts/test.sh installs it); without it the
/// test fails unless GPURENT_TEST_SKIP_PROMTOOL=1.
fn promtool() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("promtool"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("GPURENT_TEST_SKIP_PROMTOOL").as_deref() == Ok("1"),
            "promtool is not on PATH: install Debian's `prometheus` package (scripts/test.sh \
             does), or set GPURENT_TEST_SKIP_PROMTOOL=1 to skip this check"
        );
        eprintln!("promtool not found; skipped (GPURENT_TEST_SKIP_PROMTOOL=1)");
    }
    found
}

/// `promtool check metrics` on `text`: it must parse, and its only lint findings may be
/// dcgm-exporter's own names and labels, kept as they are so that its dashboards work
/// (`modelName` is camelCase, `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL` a counter without `_total`).
fn check_metrics(promtool: &Path, text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let allowed = |line: &str| {
        line.starts_with("DCGM_FI_")
            && (line.ends_with("label names should be written in 'snake_case' not 'camelCase'")
                || line
                    == "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter metrics should have \"_total\" suffix")
    };
    let unexpected: Vec<&str> = findings
        .lines()
        .filter(|l| !l.trim().is_empty() && !allowed(l))
        .collect();
    // 0: clean; 3: lint findings only (all allowed, checked above); anything else: unparsable.
    assert!(
        matches!(out.status.code(), Some(0 | 3)) && unexpected.is_empty(),
        "promtool check metrics: {:?}\n{findings}\n--- text ---\n{text}",
        out.status
    );
}

/// The metric names a PromQL expression mentions (ours and dcgm-exporter's).
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("gpurent_") || w.starts_with("DCGM_FI_"))
        .map(str::to_owned)
        .collect()
}

/// Every metric name an exposition has, with `_bucket`, `_sum` and `_count` of histograms.
fn exported(texts: &[&str]) -> BTreeSet<String> {
    texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .flat_map(|l| {
            let mut parts = l.split(' ');
            let name = parts.next().unwrap_or_default().to_owned();
            match parts.next() {
                Some("histogram") => vec![
                    format!("{name}_bucket"),
                    format!("{name}_sum"),
                    format!("{name}_count"),
                    name,
                ],
                _ => vec![name],
            }
        })
        .collect()
}

fn exprs_of(dashboard: &Value, out: &mut Vec<String>) {
    match dashboard {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query", Value::String(e)) => out.push(e.clone()),
                    (_, v) => exprs_of(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs_of(v, out)),
        _ => {}
    }
}

/// The real output of both endpoints after some work (a running reservation, a stopped one,
/// a queued one, an H200 as NVML reported it) passes promtool; the shipped rules pass
/// `promtool check rules`; the rules and the dashboard use only exported metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_output_and_the_shipped_rules() {
    let mut app = TestApp::with(Backend::Sqlite)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let probe = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/nvidia-h200/nvml-busy.json");
    app.add_node_with("h200-box", Arc::new(FakeNvml::load(&probe).unwrap()))
        .await;
    let t = app.tenant("pia", "100").await;
    let (_, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    let running = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&t.client, &running, "running").await;
    let (_, r) = t
        .client
        .reserve(json!({"gpu_type": "h200", "vram_gb": 20, "hours": 1}))
        .await;
    let shared = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&t.client, &shared, "running").await;
    let (_, r) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 1, "queue": true}))
        .await;
    assert!(r["queue_reason"].is_string(), "{r}");
    t.client.get("/api/v1/nope").await;

    let control_plane = scrape(&app.anonymous()).await;
    // The agent's sample that follows the instance's start names it.
    let mut agent = String::new();
    for _ in 0..400 {
        agent = agent_scrape(&app, "node-0").await;
        if agent.contains(&format!("reservation=\"{running}\"")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(
        agent.contains(&format!(
            "gpurent_reservation_gpu_memory_used_bytes{{reservation=\"{running}\""
        )),
        "{agent}"
    );
    let h200 = agent_scrape(&app, "h200-box").await;
    assert!(h200.contains("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\","));
    assert!(h200.contains("modelName=\"NVIDIA H200\""), "{h200}");
    assert!(sum(&h200, "DCGM_FI_DEV_GPU_UTIL", &[]) == 99.0, "{h200}");

    let names = exported(&[&control_plane, &agent]);
    let rules_path = repo_file("deploy/prometheus/gpurent-rules.yml");
    let rules = std::fs::read_to_string(&rules_path).unwrap();
    for name in metric_names(&rules) {
        assert!(
            names.contains(&name),
            "the rules use {name}, which nothing exports"
        );
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("deploy/grafana/gpurent-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    assert!(dashboard["panels"]
        .as_array()
        .is_some_and(|p| !p.is_empty()));
    let mut exprs = Vec::new();
    exprs_of(&dashboard, &mut exprs);
    assert!(!exprs.is_empty());
    for name in exprs.iter().flat_map(|e| metric_names(e)) {
        assert!(
            names.contains(&name),
            "the dashboard uses {name}, which nothing exports"
        );
    }

    if let Some(promtool) = promtool() {
        check_metrics(&promtool, &control_plane);
        check_metrics(&promtool, &agent);
        check_metrics(&promtool, &h200);
        let out = std::process::Command::new(&promtool)
            .args(["check", "rules"])
            .arg(&rules_path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    app.shutdown().await;
}
