//! `gpurent bench array`: job arrays. First the scheduling pass (the arrays' pass and the
//! queue's) timed while an array of `--tasks` waits with `--limit` of them in the queue, against
//! the same pass with as many plain queued reservations, each on its own fresh control plane;
//! then an array of `--run-tasks` that exit at once run to its end on `--run-gpus` simulated
//! GPUs, its tasks a second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_agent::executor::SimExecutor;
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{Agent, AgentConfig};
use gpurent_server::RunningServer;
use gpurent_types::api::Reservation;
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;

use super::bench_common::{bench_tenant, control_plane, percentile_ms, JOIN_TOKEN, TENANT_TOKEN};
use crate::cli::BenchArrayArgs;
use crate::output::{print_json, print_table};

#[derive(Debug, Serialize)]
struct PassResult {
    /// `array` or `plain`.
    kind: &'static str,
    tasks: u64,
    /// Tasks in the queue while the passes were timed.
    queued: u64,
    /// Seconds to submit them.
    submit_s: f64,
    pass_p50_ms: f64,
    pass_p99_ms: f64,
}

#[derive(Debug, Serialize)]
struct RunResult {
    tasks: u64,
    limit: u32,
    gpus: u32,
    seconds: f64,
    tasks_per_s: f64,
}

#[derive(Debug, Serialize)]
struct ArrayBench {
    passes: Vec<PassResult>,
    run: RunResult,
}

/// A control plane and an agent with `gpus` simulated RTX 4090s, ready.
struct Fleet {
    server: RunningServer,
    base: String,
    http: reqwest::Client,
    stop: watch::Sender<bool>,
    agent: tokio::task::JoinHandle<()>,
    dir: std::path::PathBuf,
}

impl Fleet {
    async fn start(name: &str, gpus: u32) -> anyhow::Result<Fleet> {
        let dir =
            std::env::temp_dir().join(format!("gpurent-bench-array-{name}-{}", std::process::id()));
        let (store, server) = control_plane(&dir).await?;
        bench_tenant(&store, 100_000_000).await?;
        let base = format!("http://{}", server.addr);
        let mut config = AgentConfig::new(&base, dir.join("agent"), "bench-node");
        config.join_token = Some(JOIN_TOKEN.to_owned());
        let sim = Arc::new(SimGpus::parse(&format!("{gpus}xRTX4090"), "bench-node")?);
        let (stop, stopped) = watch::channel(false);
        let agent = tokio::spawn(async move {
            if let Err(e) = Agent::new(config, sim, Arc::new(SimExecutor::new()))
                .run(stopped)
                .await
            {
                eprintln!("bench: the agent stopped: {e}");
            }
        });
        let http = reqwest::Client::new();
        let fleet = Fleet {
            server,
            base,
            http,
            stop,
            agent,
            dir,
        };
        for _ in 0..400 {
            let offers: serde_json::Value = fleet.get("/api/v1/offers").await?;
            if offers[0]["available"].as_u64().unwrap_or(0) >= u64::from(gpus) {
                return Ok(fleet);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        bail!("the simulated node did not come up")
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        Ok(self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TENANT_TOKEN)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    async fn reserve(&self, body: &serde_json::Value) -> anyhow::Result<Reservation> {
        let response = self
            .http
            .post(format!("{}/api/v1/reservations", self.base))
            .bearer_auth(TENANT_TOKEN)
            .json(body)
            .send()
            .await?;
        let status = response.status();
        if !status.is_success() {
            bail!("reserve: {status}: {}", response.text().await?);
        }
        Ok(response.json().await?)
    }

    /// `passes` scheduling passes, each timed, sorted.
    async fn time_passes(&self, passes: usize) -> anyhow::Result<Vec<Duration>> {
        let mut times = Vec::with_capacity(passes);
        for _ in 0..passes {
            let started = Instant::now();
            self.server
                .scheduling_pass()
                .await
                .context("a scheduling pass")?;
            times.push(started.elapsed());
        }
        times.sort();
        Ok(times)
    }

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let _ = self.agent.await;
        self.server.shutdown().await?;
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// Tasks that never end by themselves: the sim runs a command other than `exit N` until
/// stopped.
fn body(array: Option<String>) -> serde_json::Value {
    json!({"gpu_type": "rtx4090", "hours": 1, "queue": true, "array": array})
}

async fn pass_with_array(args: &BenchArrayArgs) -> anyhow::Result<PassResult> {
    let fleet = Fleet::start("pass-array", args.gpus).await?;
    let started = Instant::now();
    let array = fleet
        .reserve(&body(Some(format!(
            "0-{}%{}",
            args.tasks.saturating_sub(1),
            args.limit
        ))))
        .await?;
    // Until its window is in the queue.
    let want = u64::from(args.limit).min(args.tasks);
    loop {
        let live: Vec<Reservation> = fleet
            .get(&format!(
                "/api/v1/reservations/{}/tasks?live=true&limit=1000&from=0",
                array.id
            ))
            .await?;
        if live.len() as u64 >= want.min(1000) {
            break;
        }
        fleet.server.scheduling_pass().await?;
    }
    let submit_s = started.elapsed().as_secs_f64();
    let times = fleet.time_passes(args.passes).await?;
    fleet.stop().await?;
    Ok(PassResult {
        kind: "array",
        tasks: args.tasks,
        queued: want.saturating_sub(u64::from(args.gpus)),
        submit_s,
        pass_p50_ms: percentile_ms(&times, 0.5),
        pass_p99_ms: percentile_ms(&times, 0.99),
    })
}

async fn pass_with_plain(args: &BenchArrayArgs) -> anyhow::Result<PassResult> {
    let fleet = Fleet::start("pass-plain", args.gpus).await?;
    let started = Instant::now();
    // Eight at a time, as clients would send them.
    let body = body(None);
    let mut left = args.tasks;
    while left > 0 {
        let n = left.min(8);
        let mut sent = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (http, url, body) = (
                fleet.http.clone(),
                format!("{}/api/v1/reservations", fleet.base),
                body.clone(),
            );
            sent.spawn(async move {
                http.post(url)
                    .bearer_auth(TENANT_TOKEN)
                    .json(&body)
                    .send()
                    .await?
                    .error_for_status()
                    .map(drop)
            });
        }
        while let Some(done) = sent.join_next().await {
            done??;
        }
        left -= n;
    }
    let submit_s = started.elapsed().as_secs_f64();
    let times = fleet.time_passes(args.passes).await?;
    fleet.stop().await?;
    Ok(PassResult {
        kind: "plain",
        tasks: args.tasks,
        queued: args.tasks.saturating_sub(u64::from(args.gpus)),
        submit_s,
        pass_p50_ms: percentile_ms(&times, 0.5),
        pass_p99_ms: percentile_ms(&times, 0.99),
    })
}

async fn run_to_the_end(args: &BenchArrayArgs) -> anyhow::Result<RunResult> {
    let fleet = Fleet::start("run", args.run_gpus).await?;
    let started = Instant::now();
    let array = fleet
        .reserve(
            &json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "0"],
            "array": format!("0-{}%{}", args.run_tasks.saturating_sub(1), args.run_gpus)}),
        )
        .await?;
    let deadline = started + Duration::from_secs(3600);
    loop {
        let r: Reservation = fleet
            .get(&format!("/api/v1/reservations/{}", array.id))
            .await?;
        if r.ended_at.is_some() {
            let done = r.array.map_or(0, |a| a.done);
            if done != args.run_tasks {
                bail!(
                    "the array ended with {done} of {} tasks done",
                    args.run_tasks
                );
            }
            break;
        }
        if Instant::now() > deadline {
            bail!("the array did not end within an hour");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    fleet.stop().await?;
    #[allow(clippy::cast_precision_loss)] // counts of tasks
    let tasks_per_s = args.run_tasks as f64 / seconds;
    Ok(RunResult {
        tasks: args.run_tasks,
        limit: args.run_gpus,
        gpus: args.run_gpus,
        seconds,
        tasks_per_s,
    })
}

pub async fn run(args: BenchArrayArgs, json: bool) -> anyhow::Result<()> {
    if args.tasks == 0 || args.run_tasks == 0 || args.limit == 0 || args.run_gpus == 0 {
        bail!("--tasks, --run-tasks, --limit and --run-gpus must be at least 1");
    }
    eprintln!("bench: an array of {} tasks, %{}", args.tasks, args.limit);
    let array = pass_with_array(&args).await?;
    let mut passes = vec![array];
    if !args.no_plain {
        eprintln!("bench: {} plain queued reservations", args.tasks);
        passes.push(pass_with_plain(&args).await?);
    }
    eprintln!("bench: an array of {} tasks run to its end", args.run_tasks);
    let run = run_to_the_end(&args).await?;
    let result = ArrayBench { passes, run };
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    let rows: Vec<Vec<String>> = result
        .passes
        .iter()
        .map(|p| {
            vec![
                p.kind.to_owned(),
                p.tasks.to_string(),
                p.queued.to_string(),
                format!("{:.1}", p.submit_s),
                format!("{:.2}", p.pass_p50_ms),
                format!("{:.2}", p.pass_p99_ms),
            ]
        })
        .collect();
    print_table(
        &[
            "KIND",
            "TASKS",
            "QUEUED",
            "SUBMIT S",
            "PASS P50 MS",
            "PASS P99 MS",
        ],
        &rows,
    );
    let r = &result.run;
    print_table(
        &["RUN TASKS", "LIMIT", "GPUS", "SECONDS", "TASKS/S"],
        &[vec![
            r.tasks.to_string(),
            r.limit.to_string(),
            r.gpus.to_string(),
            format!("{:.1}", r.seconds),
            format!("{:.0}", r.tasks_per_s),
        ]],
    );
    Ok(())
}
