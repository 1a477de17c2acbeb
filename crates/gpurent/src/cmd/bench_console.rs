//! `gpurent bench console`: the web console's server time per page with a full store (1,000
//! reservations on 100 nodes by default), the bytes of a first load (the instance page with
//! its terminal, compressed as sent), and how long a status change takes to show on the
//! instances page when it is refreshed as `console.js` does (every second).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gpurent_server::{hash_token, RunningServer, ServerConfig};
use gpurent_store::prelude::*;
use gpurent_store::SqlStore;
use gpurent_types::{Money, SystemClock};
use serde::Serialize;

use super::bench_common::{percentile_ms, TENANT_TOKEN};
use crate::cli::BenchConsoleArgs;
use crate::output::{print_json, print_line, print_table};

const PASSWORD: &str = "bench console password";
/// How often `console.js` refreshes a live part of a page (`data-live="1000"`).
const LIVE_EVERY: Duration = Duration::from_millis(1000);

#[derive(Debug, Serialize)]
struct PageTime {
    page: String,
    viewer: String,
    requests: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    bytes: usize,
}

#[derive(Debug, Serialize)]
struct ConsoleResult {
    reservations: usize,
    nodes: usize,
    pages: Vec<PageTime>,
    /// The instance page and everything it loads, as sent (gzip), and uncompressed.
    first_load_bytes: usize,
    first_load_uncompressed_bytes: usize,
    first_load_files: Vec<(String, usize)>,
    /// From a stop to the instances page showing the new status, refreshed every second.
    status_delay_p50_ms: f64,
    status_delay_max_ms: f64,
}

fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-console-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub async fn run(args: BenchConsoleArgs, json: bool) -> anyhow::Result<()> {
    let dir = tempdir()?;
    let result = measure(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    let rows: Vec<Vec<String>> = result
        .pages
        .iter()
        .map(|p| {
            vec![
                p.page.clone(),
                p.viewer.clone(),
                p.requests.to_string(),
                format!("{:.2}", p.p50_ms),
                format!("{:.2}", p.p99_ms),
                format!("{:.2}", p.max_ms),
                p.bytes.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "page",
            "viewer",
            "requests",
            "p50 ms",
            "p99 ms",
            "max ms",
            "bytes (gzip)",
        ],
        &rows,
    );
    print_line("");
    let files: Vec<Vec<String>> = result
        .first_load_files
        .iter()
        .map(|(f, b)| vec![f.clone(), b.to_string()])
        .collect();
    print_table(&["first load of an instance page", "bytes (gzip)"], &files);
    print_line(&format!(
        "first load: {} bytes compressed ({} uncompressed); a status change shows on /instances in p50 {:.0} ms, at most {:.0} ms",
        result.first_load_bytes,
        result.first_load_uncompressed_bytes,
        result.status_delay_p50_ms,
        result.status_delay_max_ms
    ));
    Ok(())
}

async fn measure(args: &BenchConsoleArgs, dir: &std::path::Path) -> anyhow::Result<ConsoleResult> {
    let store = Arc::new(
        SqlStore::connect(&format!("sqlite://{}/bench.db", dir.display()))
            .await
            .context("open the store")?,
    );
    let now = chrono::Utc::now();
    let admin_token = "gpr_bench_admin";
    let admin = super::bench_common::bench_admin(&store, now).await?;
    super::bench_common::bench_tenant(&store, 1_000_000_000).await?;
    let tenant = store
        .authenticate(&hash_token(TENANT_TOKEN))
        .await?
        .context("tenant")?;
    eprintln!(
        "bench: {} nodes of 8 GPUs, {} running reservations",
        args.nodes, args.reservations
    );
    let per_node = args.reservations.div_ceil(args.nodes.max(1));
    let mut left = args.reservations;
    for n in 0..args.nodes {
        let node = super::bench_common::bench_node(&store, n, 8, now).await?;
        let here = per_node.min(left);
        left -= here;
        store
            .seed_running_reservations(&tenant.id, &node, here, Money::from_micros(2_500_000), now)
            .await?;
    }
    // Nodes registered once and never heard from again stay live for the run.
    let config = ServerConfig {
        heartbeat_interval: Duration::from_secs(24 * 3600),
        missed_heartbeats: 1,
        ..ServerConfig::default()
    }
    .without_limits();
    let server = RunningServer::start(
        "127.0.0.1:0".parse()?,
        store.clone(),
        Arc::new(SystemClock),
        config,
    )
    .await?;
    let base = format!("http://{}", server.addr);
    let outcome = pages(args, &base, admin_token, &admin.id).await;
    let _ = server.shutdown().await;
    store.close().await;
    outcome
}

/// A browser's session of the console, as the login form gives it.
struct Session {
    http: reqwest::Client,
    base: String,
    cookie: String,
}

impl Session {
    async fn login(base: &str, token: &str, user_id: &str, name: &str) -> anyhow::Result<Session> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let set = http
            .post(format!("{base}/api/v1/users/{user_id}/password"))
            .bearer_auth(token)
            .json(&serde_json::json!({ "password": PASSWORD }))
            .send()
            .await?;
        anyhow::ensure!(
            set.status().is_success(),
            "set the password: {}",
            set.status()
        );
        let form = http.get(format!("{base}/login")).send().await?;
        let login_cookie = set_cookie(&form, "gpurent_login").context("the login cookie")?;
        let html = form.text().await?;
        let csrf = field(&html, "_csrf").context("the login form's CSRF field")?;
        let answer = http
            .post(format!("{base}/login"))
            .header("cookie", format!("gpurent_login={login_cookie}"))
            .form(&[("username", name), ("password", PASSWORD), ("_csrf", &csrf)])
            .send()
            .await?;
        let cookie = set_cookie(&answer, "gpurent_session").context("logged in")?;
        Ok(Session {
            http,
            base: base.to_owned(),
            cookie,
        })
    }

    async fn get(&self, path: &str, live: bool) -> anyhow::Result<(reqwest::StatusCode, Vec<u8>)> {
        let mut r = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", format!("gpurent_session={}", self.cookie))
            .header("accept-encoding", "gzip");
        if live {
            r = r.header("x-gpurent-live", "1");
        }
        let answer = r.send().await?;
        let status = answer.status();
        Ok((status, answer.bytes().await?.to_vec()))
    }
}

fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| {
            let (k, v) = c.split(';').next()?.split_once('=')?;
            (k == name && !v.is_empty()).then(|| v.to_owned())
        })
}

fn field(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\" value=\""))? + name.len() + 15;
    Some(html[at..at + html[at..].find('"')?].to_owned())
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    match flate2::read::GzDecoder::new(bytes).read_to_end(&mut out) {
        Ok(_) => out,
        Err(_) => bytes.to_vec(),
    }
}

async fn pages(
    args: &BenchConsoleArgs,
    base: &str,
    admin_token: &str,
    admin_id: &str,
) -> anyhow::Result<ConsoleResult> {
    let http = reqwest::Client::new();
    let tenant_id = http
        .get(format!("{base}/api/v1/reservations?limit=1"))
        .bearer_auth(TENANT_TOKEN)
        .send()
        .await?
        .json::<serde_json::Value>()
        .await?;
    let first = tenant_id[0]["id"]
        .as_str()
        .context("a reservation")?
        .to_owned();
    let tenant_user = tenant_id[0]["tenant_id"]
        .as_str()
        .context("its tenant")?
        .to_owned();
    let tenant = Session::login(base, TENANT_TOKEN, &tenant_user, "bench").await?;
    let admin = Session::login(base, admin_token, admin_id, "admin").await?;
    let tenant_pages = [
        "/offers".to_owned(),
        "/instances".to_owned(),
        format!("/instances/{first}"),
        "/billing".to_owned(),
        "/account".to_owned(),
    ];
    let admin_pages = [
        "/nodes",
        "/admin",
        "/admin/reservations",
        "/admin/users",
        "/admin/events",
        "/admin/audit",
        "/admin/reports",
        "/admin/ledger",
    ];
    let mut out = Vec::new();
    for (who, session, list) in [
        ("tenant", &tenant, tenant_pages.to_vec()),
        (
            "admin",
            &admin,
            admin_pages.iter().map(|p| (*p).to_owned()).collect(),
        ),
    ] {
        for page in list {
            eprintln!("bench: {page} as the {who}, {} times", args.requests);
            let (status, body) = session.get(&page, false).await?;
            if status == reqwest::StatusCode::NOT_FOUND && !page.starts_with("/instances/") {
                eprintln!("bench: {page} is not there (404); skipped");
                continue;
            }
            anyhow::ensure!(status.is_success(), "{page} as the {who}: {status}");
            let mut times = Vec::with_capacity(args.requests);
            for _ in 0..args.requests {
                let t0 = Instant::now();
                let (status, _) = session.get(&page, false).await?;
                times.push(t0.elapsed());
                anyhow::ensure!(status.is_success(), "{page}: {status}");
            }
            times.sort();
            out.push(PageTime {
                page: page.clone(),
                viewer: who.to_owned(),
                requests: times.len(),
                p50_ms: percentile_ms(&times, 0.5),
                p99_ms: percentile_ms(&times, 0.99),
                max_ms: percentile_ms(&times, 1.0),
                bytes: body.len(),
            });
        }
    }
    // A first load: the page, then every file it links.
    let (_, html) = tenant.get(&format!("/instances/{first}"), false).await?;
    let mut files = vec![(format!("/instances/{first}"), html.len())];
    let mut uncompressed = gunzip(&html).len();
    let text = String::from_utf8_lossy(&gunzip(&html)).into_owned();
    for attr in ["href=\"/assets/", "src=\"/assets/"] {
        for (at, _) in text.match_indices(attr) {
            let start = at + attr.len() - "/assets/".len();
            let Some(end) = text[start..].find('"') else {
                continue;
            };
            let url = text[start..start + end].replace("&amp;", "&");
            let (status, body) = tenant.get(&url, false).await?;
            anyhow::ensure!(status.is_success(), "{url}: {status}");
            uncompressed += gunzip(&body).len();
            files.push((url, body.len()));
        }
    }
    let first_load_bytes = files.iter().map(|(_, b)| b).sum();
    // Status changes, seen by a poller that refreshes as console.js does.
    let mut delays = Vec::new();
    let list = http
        .get(format!(
            "{base}/api/v1/reservations?limit={}",
            args.status_trials
        ))
        .bearer_auth(TENANT_TOKEN)
        .send()
        .await?
        .json::<Vec<serde_json::Value>>()
        .await?;
    for (i, r) in list.iter().enumerate() {
        let id = r["id"].as_str().context("id")?;
        // Stops at a different point of the poller's second each time.
        let phase = LIVE_EVERY.mul_f64(f64::from(u32::try_from(i).unwrap_or(0) % 10) / 10.0);
        let poller_start = Instant::now();
        tokio::time::sleep(phase).await;
        let stopped_at = Instant::now();
        let stop = http
            .post(format!("{base}/api/v1/reservations/{id}/stop"))
            .bearer_auth(TENANT_TOKEN)
            .send()
            .await?;
        anyhow::ensure!(stop.status().is_success(), "stop {id}: {}", stop.status());
        let needle = format!("data-reservation-id=\"{id}\"");
        let mut tick = poller_start;
        loop {
            tick += LIVE_EVERY;
            tokio::time::sleep_until(tick.into()).await;
            let (_, body) = tenant.get("/instances", true).await?;
            let text = String::from_utf8_lossy(&gunzip(&body)).into_owned();
            let Some(row) = text.find(&needle) else {
                anyhow::bail!("{id} is not on the first page of /instances");
            };
            let row = &text[row..text[row..].find("</tr>").map_or(text.len(), |e| row + e)];
            if row.contains(">stopping<") || row.contains(">stopped<") {
                delays.push(stopped_at.elapsed());
                break;
            }
            anyhow::ensure!(
                stopped_at.elapsed() < Duration::from_secs(30),
                "{id} never showed its stop"
            );
        }
    }
    delays.sort();
    Ok(ConsoleResult {
        reservations: args.reservations,
        nodes: args.nodes,
        pages: out,
        first_load_bytes,
        first_load_uncompressed_bytes: uncompressed,
        first_load_files: files,
        status_delay_p50_ms: percentile_ms(&delays, 0.5),
        status_delay_max_ms: percentile_ms(&delays, 1.0),
    })
}
