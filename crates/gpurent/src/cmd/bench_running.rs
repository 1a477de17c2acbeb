//! `gpurent bench running`: reserve-to-running latency on a real executor. One reservation at a
//! time: POST, then the control plane's own timestamps `created_at` → `started_at` (the agent's
//! first `running` report), so client polling adds nothing to the figure. With `--pull`, each
//! reservation's image is pulled by its node first, against `docker pull` of it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gpurent_agent::executor::{DockerExecutor, ResourcesPerGpu, SimExecutor};
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{Agent, AgentConfig, Executor};
use gpurent_types::api::Reservation;
use serde::Serialize;
use tokio::sync::watch;

use super::bench_common::{control_plane, percentile_ms, JOIN_TOKEN};
use crate::cli::{BenchRunningArgs, ExecutorKind};
use crate::output::{print_json, print_table};

#[derive(Debug, Serialize)]
struct RunningResult {
    executor: String,
    reservations: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    mean_ms: f64,
    /// With `--pull`: the median of as many `docker pull`s of the image.
    #[serde(skip_serializing_if = "Option::is_none")]
    docker_pull_ms: Option<f64>,
}

/// Removes `image` from the Engine (gone already is fine).
fn remove_image(image: &str) -> anyhow::Result<()> {
    let out = std::process::Command::new("docker")
        .args(["image", "rm", "-f", image])
        .output()
        .context("docker image rm")?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !text.contains("No such image") {
        bail!("docker image rm {image}: {text}");
    }
    Ok(())
}

/// `docker pull IMAGE` from nothing, timed.
fn docker_pull(image: &str) -> anyhow::Result<Duration> {
    remove_image(image)?;
    let started = std::time::Instant::now();
    let out = std::process::Command::new("docker")
        .args(["pull", "-q", image])
        .output()
        .context("docker pull")?;
    if !out.status.success() {
        bail!(
            "docker pull {image}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(started.elapsed())
}

pub async fn run(args: BenchRunningArgs, json: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-running-{}", std::process::id()));
    let (store, server) = control_plane(&dir).await?;
    let _now = chrono::Utc::now();
    let tenant = super::bench_common::TENANT_TOKEN;
    super::bench_common::bench_tenant(&store, 1_000_000).await?;
    let base = format!("http://{}", server.addr);

    let resources = ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 256,
    };
    let (executor, image, command): (Arc<dyn Executor>, Option<String>, Vec<String>) =
        match args.executor {
            ExecutorKind::Docker | ExecutorKind::Auto => (
                Arc::new(
                    DockerExecutor::connect(resources, false)
                        .await?
                        .scoped("bench-node")
                        .with_grace(2),
                ),
                Some(args.image.clone()),
                // PID 1 in a container ignores SIGTERM unless it says otherwise.
                vec![
                    "sh".into(),
                    "-c".into(),
                    "trap 'exit 0' TERM; sleep 600 & wait".into(),
                ],
            ),
            ExecutorKind::Process => (
                super::bench_common::process_executor(
                    &dir,
                    resources,
                    args.unisolated,
                    args.shared_network,
                    args.disk_gb,
                )?,
                None,
                vec!["sleep".into(), "600".into()],
            ),
            ExecutorKind::Sim => (Arc::new(SimExecutor::new()), None, vec![]),
        };
    if args.pull && image.is_none() {
        bail!("--pull is for the docker executor (its image is what is pulled)");
    }
    let mut baseline = Vec::new();
    if let (true, Some(image)) = (args.pull, &image) {
        for _ in 0..args.reservations {
            baseline.push(docker_pull(image)?);
        }
        eprintln!("bench: docker pull {image}: {baseline:?}");
    }
    let name = executor.name();
    let mut config = AgentConfig::new(&base, dir.join("agent"), "bench-node");
    config.join_token = Some(JOIN_TOKEN.to_owned());
    let gpus = Arc::new(SimGpus::parse(
        &format!("{}xRTX4090", args.reservations.max(1)),
        "bench-node",
    )?);
    let (stop, stopped) = watch::channel(false);
    let agent = tokio::spawn(Agent::new(config, gpus, executor).run(stopped));

    let http = reqwest::Client::new();
    for _ in 0..200 {
        let offers: serde_json::Value = http
            .get(format!("{base}/api/v1/offers"))
            .bearer_auth(tenant)
            .send()
            .await?
            .json()
            .await?;
        if offers[0]["available"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "bench: {} reservations, one at a time, on the {name} executor",
        args.reservations
    );
    let body =
        serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "image": image, "command": command});
    let mut latencies = Vec::new();
    let mut ids = Vec::new();
    // A pull may take minutes; an image already there, milliseconds.
    let (polls, poll) = if args.pull {
        (36_000, Duration::from_millis(50))
    } else {
        (2000, Duration::from_millis(5))
    };
    for _ in 0..args.reservations {
        if let (true, Some(image)) = (args.pull, &image) {
            remove_image(image)?;
        }
        let created: Reservation = http
            .post(format!("{base}/api/v1/reservations"))
            .bearer_auth(tenant)
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let mut running = None;
        for _ in 0..polls {
            let r: Reservation = http
                .get(format!("{base}/api/v1/reservations/{}", created.id))
                .bearer_auth(tenant)
                .send()
                .await?
                .json()
                .await?;
            if let Some(started) = r.started_at {
                running = Some(started - r.created_at);
                break;
            }
            if r.status.is_terminal() {
                bail!("reservation {} ended as {} before running", r.id, r.status);
            }
            tokio::time::sleep(poll).await;
        }
        let latency = running.context("a reservation did not start in time")?;
        latencies.push(latency.to_std().unwrap_or_default());
        ids.push(created.id);
    }
    eprintln!("bench: stopping {} reservations", ids.len());
    for id in &ids {
        http.post(format!("{base}/api/v1/reservations/{id}/stop"))
            .bearer_auth(tenant)
            .send()
            .await?;
    }
    for _ in 0..600 {
        let rs: Vec<Reservation> = http
            .get(format!("{base}/api/v1/reservations"))
            .bearer_auth(tenant)
            .send()
            .await?
            .json()
            .await?;
        if rs.iter().all(|r| r.status.is_terminal()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = stop.send(true);
    let _ = agent.await;
    server.shutdown().await?;
    store.close().await;
    let _ = std::fs::remove_dir_all(&dir);

    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pct = |p: f64| percentile_ms(&latencies, p);
    #[allow(clippy::cast_precision_loss)]
    let mean = latencies.iter().map(|d| ms(*d)).sum::<f64>() / latencies.len().max(1) as f64;
    let result = RunningResult {
        executor: name.to_owned(),
        reservations: latencies.len(),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
        mean_ms: mean,
        docker_pull_ms: (!baseline.is_empty()).then(|| {
            baseline.sort();
            percentile_ms(&baseline, 0.5)
        }),
    };
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    print_table(
        &[
            "executor",
            "reservations",
            "p50 ms",
            "p99 ms",
            "max ms",
            "mean ms",
            "docker pull ms",
        ],
        &[vec![
            result.executor.clone(),
            result.reservations.to_string(),
            format!("{:.1}", result.p50_ms),
            format!("{:.1}", result.p99_ms),
            format!("{:.1}", result.max_ms),
            format!("{:.1}", result.mean_ms),
            result
                .docker_pull_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1}")),
        ]],
    );
    Ok(())
}
