//! `gpurent bench endpoint`: endpoints on a real control plane and a real process executor.
//! Four figures: the cold start (the first request to a scaled-to-zero endpoint, answered, its
//! replica a small Python HTTP app), the proxy's overhead against the same app called directly
//! at a concurrency, requests per second through one control plane with several endpoints (and
//! the CPU it took), and the time from a load step to the new replicas serving. The last three
//! serve `gpurent bench app` (hyper), so that the app is not what they measure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_agent::executor::ResourcesPerGpu;
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{Agent, AgentConfig};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::bench_common::{control_plane, percentile_ms, JOIN_TOKEN, TENANT_TOKEN};
use crate::cli::BenchEndpointArgs;
use crate::output::{print_json, print_table};

/// The replicas' app: `/health`, and any path sleeps `?ms=N` then answers a few bytes. Keeps
/// connections open (HTTP/1.1), as a model server does.
const APP: &str = "import http.server as s, sys, time, urllib.parse as u
class H(s.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        q = u.parse_qs(u.urlparse(self.path).query)
        ms = int(q.get('ms', ['0'])[0])
        if ms:
            time.sleep(ms / 1000)
        self.send_response(200)
        self.send_header('content-length', '2')
        self.end_headers()
        self.wfile.write(b'ok')
    def log_message(self, *args):
        pass
s.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
";

#[derive(Debug, Serialize)]
struct Figures {
    executor: &'static str,
    cold_starts: usize,
    cold_start_p50_ms: f64,
    cold_start_p99_ms: f64,
    cold_start_max_ms: f64,
    concurrency: usize,
    requests: usize,
    /// What each request took the app.
    app_ms: u64,
    direct_p50_ms: f64,
    direct_rps: f64,
    proxied_p50_ms: f64,
    proxied_rps: f64,
    /// proxied p50 - direct p50.
    added_p50_ms: f64,
    /// proxied rps / direct rps.
    throughput_ratio: f64,
    endpoints: usize,
    many_rps: f64,
    /// CPU this process (control plane, agent, load) used per wall second in that run, in cores.
    many_cpu_cores: f64,
    /// From a load step (one to `max` replicas wanted) to every new replica serving.
    step_to_serving_ms: f64,
}

/// A control plane, a process agent with enough GPUs, and the tenant's HTTP client.
struct Bench {
    base: String,
    http: reqwest::Client,
}

impl Bench {
    async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TENANT_TOKEN);
        if let Some(body) = body {
            r = r.json(&body);
        }
        let r = r.send().await?;
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{path}: {status}: {body}");
        }
        Ok(body)
    }

    /// An endpoint of the Python app on port 8000.
    async fn create(&self, name: &str, scaling: Value) -> anyhow::Result<()> {
        self.create_of(name, scaling, json!(["python3", "-c", APP, "8000"]))
            .await
    }

    async fn create_of(&self, name: &str, scaling: Value, command: Value) -> anyhow::Result<()> {
        self.api(
            reqwest::Method::POST,
            "/api/v1/endpoints",
            Some(
                json!({"name": name, "gpu_type": "rtx4090", "port": 8000, "scaling": scaling,
                        "command": command}),
            ),
        )
        .await?;
        Ok(())
    }

    async fn endpoint(&self, name: &str) -> anyhow::Result<Value> {
        self.api(
            reqwest::Method::GET,
            &format!("/api/v1/endpoints/{name}"),
            None,
        )
        .await
    }

    /// Waits (up to `within`) until `check` holds of the endpoint.
    async fn until(
        &self,
        name: &str,
        within: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut last = Value::Null;
        while started.elapsed() < within {
            last = self.endpoint(name).await?;
            if check(&last) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("endpoint {name}: not as expected within {within:?}; last seen: {last}")
    }

    /// Removes every endpoint, then waits (up to a minute) until no instance of the node runs.
    async fn remove_all(&self, executor: &dyn gpurent_agent::Executor) {
        if let Ok(Value::Array(endpoints)) = self
            .api(reqwest::Method::GET, "/api/v1/endpoints", None)
            .await
        {
            for e in endpoints {
                if let Some(name) = e["name"].as_str() {
                    let path = format!("/api/v1/endpoints/{name}");
                    let _ = self.api(reqwest::Method::DELETE, &path, None).await;
                }
            }
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            let running = executor.list().await.map(|l| {
                l.iter()
                    .any(|o| o.state == gpurent_agent::reconcile::ObservedState::Running)
            });
            if running.is_ok_and(|r| !r) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("bench: some replicas still run after a minute");
    }

    async fn call(&self, url: &str) -> anyhow::Result<()> {
        let r = self.http.get(url).send().await?;
        let status = r.status();
        let _ = r.bytes().await?;
        if !status.is_success() {
            bail!("{url}: {status}");
        }
        Ok(())
    }
}

/// `requests` GETs of `url` at `concurrency`: their latencies, sorted, and the rate.
async fn load(
    http: &reqwest::Client,
    url: &str,
    requests: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<Duration>, f64)> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (http, url, next) = (http.clone(), url.to_owned(), Arc::clone(&next));
            tokio::spawn(async move {
                let mut took = Vec::new();
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < requests {
                    let at = Instant::now();
                    let r = http.get(&url).send().await?;
                    let status = r.status();
                    let _ = r.bytes().await?;
                    if !status.is_success() {
                        bail!("{url}: {status}");
                    }
                    took.push(at.elapsed());
                }
                Ok::<_, anyhow::Error>(took)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(requests);
    for w in workers {
        all.extend(w.await??);
    }
    let rate = requests as f64 / started.elapsed().as_secs_f64();
    all.sort();
    Ok((all, rate))
}

/// CPU time this process has used, all its threads, user and system (`/proc/self/stat`, in
/// the kernel's USER_HZ of 100 ticks a second).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

pub async fn run(args: BenchEndpointArgs, json: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-endpoint-{}", std::process::id()));
    let (store, server) = control_plane(&dir).await?;
    super::bench_common::bench_tenant(&store, 1_000_000).await?;
    let base = format!("http://{}", server.addr);
    let resources = ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 256,
    };
    let executor =
        super::bench_common::process_executor(&dir, resources, args.unisolated, false, 0)?;
    let mut config = AgentConfig::new(&base, dir.join("agent"), "bench-node");
    config.join_token = Some(JOIN_TOKEN.to_owned());
    let gpus = Arc::new(SimGpus::parse(
        &format!("{}xRTX4090", args.endpoints + 8),
        "bench-node",
    )?);
    let (stop, stopped) = watch::channel(false);
    let agent = tokio::spawn(Agent::new(config, gpus, Arc::clone(&executor)).run(stopped));
    let bench = Bench {
        base: base.clone(),
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()?,
    };
    let app = AppBinary::place(args.unisolated)?;
    let result = measure(&bench, &args, &app).await;
    // An agent that stops leaves its instances running (they ride through its restarts): every
    // endpoint is removed and its replicas seen gone first, whether the run worked or not.
    bench.remove_all(&*executor).await;
    drop(app);
    let _ = stop.send(true);
    let _ = agent.await;
    server.shutdown().await?;
    store.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    let figures = result?;
    if json {
        return print_json(&figures).map_err(|e| anyhow::anyhow!(e));
    }
    let f = &figures;
    print_table(
        &["figure", "value"],
        &[
            vec![
                format!("cold start p50 / p99 / max ({} starts)", f.cold_starts),
                format!(
                    "{:.0} / {:.0} / {:.0} ms",
                    f.cold_start_p50_ms, f.cold_start_p99_ms, f.cold_start_max_ms
                ),
            ],
            vec![
                format!(
                    "direct p50, rps (concurrency {}, app {} ms)",
                    f.concurrency, f.app_ms
                ),
                format!("{:.2} ms, {:.0}/s", f.direct_p50_ms, f.direct_rps),
            ],
            vec![
                "through the endpoint p50, rps".into(),
                format!("{:.2} ms, {:.0}/s", f.proxied_p50_ms, f.proxied_rps),
            ],
            vec![
                "added p50; throughput of direct".into(),
                format!(
                    "{:.2} ms; {:.0}%",
                    f.added_p50_ms,
                    f.throughput_ratio * 100.0
                ),
            ],
            vec![
                format!("{} endpoints: rps, CPU", f.endpoints),
                format!("{:.0}/s, {:.2} cores", f.many_rps, f.many_cpu_cores),
            ],
            vec![
                "load step to new replicas serving".into(),
                format!("{:.0} ms", f.step_to_serving_ms),
            ],
        ],
    );
    Ok(())
}

/// This binary where a replica can run it (`gpurent bench app`): as it is when replicas are
/// not isolated, else a copy under `/opt` (a sandbox sees the node's `/usr`, `/etc` and `/opt`
/// only), removed when dropped.
struct AppBinary {
    path: std::path::PathBuf,
    copy: Option<std::path::PathBuf>,
}

impl AppBinary {
    fn place(unisolated: bool) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("this binary's path")?;
        if unisolated {
            return Ok(AppBinary {
                path: exe,
                copy: None,
            });
        }
        let dir = std::path::PathBuf::from(format!("/opt/gpurent-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("gpurent");
        std::fs::copy(&exe, &path)
            .with_context(|| format!("copying this binary to {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        Ok(AppBinary {
            path,
            copy: Some(dir),
        })
    }

    /// The command that serves the app on `port`.
    fn command(&self, port: u16) -> Value {
        json!([self.path, "bench", "app", "--port", port.to_string()])
    }
}

impl Drop for AppBinary {
    fn drop(&mut self) {
        if let Some(dir) = &self.copy {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

async fn measure(
    bench: &Bench,
    args: &BenchEndpointArgs,
    app: &AppBinary,
) -> anyhow::Result<Figures> {
    // Cold starts: the endpoint scales to zero at once when idle; each request starts it.
    bench
        .create(
            "cold",
            json!({"scale_down_after_s": 0, "public": true, "max_replicas": 1}),
        )
        .await?;
    let url = format!("{}/e/cold/", bench.base);
    let mut cold = Vec::new();
    for i in 0..args.cold_starts {
        bench
            .until("cold", Duration::from_secs(60), |e| {
                e["replicas"] == json!([])
            })
            .await?;
        let at = Instant::now();
        bench
            .call(&url)
            .await
            .with_context(|| format!("cold start {i}"))?;
        cold.push(at.elapsed());
        eprintln!(
            "bench: cold start {i}: {:.0} ms",
            at.elapsed().as_secs_f64() * 1000.0
        );
    }
    cold.sort();

    // Overhead: the same app directly on a host port, then as a ready replica.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut direct_app = std::process::Command::new(&app.path)
        .args(["bench", "app", "--port", &port.to_string()])
        .spawn()
        .context("the app for the direct baseline")?;
    let direct_url = format!("http://127.0.0.1:{port}/x?ms={}", args.app_ms);
    let mut up = false;
    for _ in 0..200 {
        if bench.call(&direct_url).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    if !up {
        let _ = direct_app.kill();
        bail!("the direct app did not answer");
    }
    let direct = load(&bench.http, &direct_url, args.requests, args.concurrency).await;
    let _ = direct_app.kill();
    let _ = direct_app.wait();
    let (direct, direct_rps) = direct?;
    bench
        .create_of(
            "steady",
            json!({"min_replicas": 1, "max_replicas": 1, "target_inflight": 1000, "public": true}),
            app.command(8000),
        )
        .await?;
    bench
        .until("steady", Duration::from_secs(60), |e| {
            e["ready_replicas"] == 1
        })
        .await?;
    let steady = format!("{}/e/steady/x?ms={}", bench.base, args.app_ms);
    let (proxied, proxied_rps) =
        load(&bench.http, &steady, args.requests, args.concurrency).await?;

    // Many endpoints: one ready replica each, the load spread over them.
    let names: Vec<String> = (0..args.endpoints).map(|i| format!("many-{i}")).collect();
    for name in &names {
        bench
            .create_of(
                name,
                json!({"min_replicas": 1, "max_replicas": 1, "target_inflight": 1000, "public": true}),
                app.command(8000),
            )
            .await?;
    }
    for name in &names {
        bench
            .until(name, Duration::from_secs(120), |e| e["ready_replicas"] == 1)
            .await?;
    }
    let (cpu_before, wall) = (cpu_time(), Instant::now());
    let per = args.requests / names.len().max(1);
    let runs: Vec<_> = names
        .iter()
        .map(|name| {
            let (http, url) = (
                bench.http.clone(),
                format!("{}/e/{name}/x?ms={}", bench.base, args.app_ms),
            );
            let concurrency = (args.concurrency / names.len()).max(1);
            tokio::spawn(async move { load(&http, &url, per, concurrency).await })
        })
        .collect();
    for r in runs {
        r.await??;
    }
    let elapsed = wall.elapsed().as_secs_f64();
    let many_rps = (per * names.len()) as f64 / elapsed;
    let many_cpu_cores = (cpu_time() - cpu_before).as_secs_f64() / elapsed;
    for name in names
        .iter()
        .chain(["steady".to_owned(), "cold".to_owned()].iter())
    {
        bench
            .api(
                reqwest::Method::DELETE,
                &format!("/api/v1/endpoints/{name}"),
                None,
            )
            .await?;
    }

    // A load step: one replica serving, then four long requests at once with a target of one.
    bench
        .create_of(
            "step",
            json!({"min_replicas": 1, "max_replicas": 4, "target_inflight": 1, "public": true}),
            app.command(8000),
        )
        .await?;
    bench
        .until("step", Duration::from_secs(60), |e| {
            e["ready_replicas"] == 1
        })
        .await?;
    let step_url = format!("{}/e/step/x?ms=5000", bench.base);
    let at = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let (http, url) = (bench.http.clone(), step_url.clone());
            tokio::spawn(async move { http.get(url).send().await })
        })
        .collect();
    bench
        .until("step", Duration::from_secs(60), |e| {
            e["ready_replicas"] == 4
        })
        .await?;
    let step = at.elapsed();
    for c in calls {
        let _ = c.await?;
    }

    let p50 = |d: &[Duration]| percentile_ms(d, 0.5);
    Ok(Figures {
        executor: if args.unisolated {
            "process (unisolated)"
        } else {
            "process"
        },
        cold_starts: cold.len(),
        cold_start_p50_ms: p50(&cold),
        cold_start_p99_ms: percentile_ms(&cold, 0.99),
        cold_start_max_ms: percentile_ms(&cold, 1.0),
        concurrency: args.concurrency,
        requests: args.requests,
        app_ms: args.app_ms,
        direct_p50_ms: p50(&direct),
        direct_rps,
        proxied_p50_ms: p50(&proxied),
        proxied_rps,
        added_p50_ms: p50(&proxied) - p50(&direct),
        throughput_ratio: proxied_rps / direct_rps,
        endpoints: names.len(),
        many_rps,
        many_cpu_cores,
        step_to_serving_ms: step.as_secs_f64() * 1000.0,
    })
}
