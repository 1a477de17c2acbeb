//! `gpurent bench agent`: what the agent costs its host. A control plane runs in this process;
//! the agent is the real binary in its own process (`gpurent agent`), replaying an NVML probe
//! with N GPUs and sending telemetry at its 2 s heartbeat. Its CPU time and resident memory
//! are read from /proc/PID.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use gpurent_store::prelude::*;
use serde::Serialize;

use super::bench_common::{control_plane, cpu_seconds, rss_mib, JOIN_TOKEN};
use crate::cli::BenchAgentArgs;
use crate::output::{print_json, print_table};

#[derive(Debug, Serialize)]
struct AgentCost {
    gpus: u32,
    seconds: f64,
    cpu_percent_of_one_core: f64,
    rss_mib: f64,
}

/// The probe's first GPU repeated `n` times, each with its own UUID and index.
fn widen_probe(probe: &serde_json::Value, n: u32) -> anyhow::Result<serde_json::Value> {
    let first = probe["devices"]
        .get(0)
        .context("the probe has no GPU")?
        .clone();
    let devices: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let mut d = first.clone();
            d["index"] = i.into();
            d["uuid"] = format!("{}-{i}", first["uuid"].as_str().unwrap_or("GPU")).into();
            d
        })
        .collect();
    let mut wide = probe.clone();
    wide["devices"] = devices.into();
    Ok(wide)
}

pub async fn run(args: BenchAgentArgs, json: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let probe_path = args.fake_nvml.clone().context(
        "--fake-nvml PROBE.json is needed (crates/agent/tests/fixtures/nvidia-h200/nvml-busy.json)",
    )?;
    let probe: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&probe_path)?)?;
    let wide = dir.join("probe.json");
    std::fs::write(&wide, serde_json::to_vec(&widen_probe(&probe, args.gpus)?)?)?;

    let (store, server) = control_plane(&dir).await?;
    let url = format!("http://{}", server.addr);
    let mut agent = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "--server",
            &url,
            "agent",
            "--join-token",
            JOIN_TOKEN,
            "--name",
            "bench-node",
            "--executor",
            "sim",
        ])
        .arg("--data-dir")
        .arg(dir.join("agent"))
        .arg("--fake-nvml")
        .arg(&wide)
        .env("GPURENT_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start the agent")?;
    let pid = agent.id().context("agent pid")?;
    let mut ready = false;
    for _ in 0..100 {
        let nodes = store
            .list_nodes(chrono::Utc::now() - chrono::Duration::seconds(10), None)
            .await?;
        if nodes
            .first()
            .is_some_and(|n| n.gpus.len() == args.gpus as usize && n.gpus[0].telemetry.is_some())
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::ensure!(ready, "the agent did not report its GPUs and telemetry");
    let stat = format!("/proc/{pid}/stat");
    let (cpu0, t0) = (cpu_seconds(&stat), Instant::now());
    eprintln!(
        "bench: measuring the agent (pid {pid}) with {} GPUs for {} s",
        args.gpus, args.seconds
    );
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let (cpu1, elapsed, rss) = (cpu_seconds(&stat), t0.elapsed().as_secs_f64(), rss_mib(pid));
    let _ = agent.kill().await;
    server.shutdown().await?;
    store.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = AgentCost {
        gpus: args.gpus,
        seconds: elapsed,
        cpu_percent_of_one_core: 100.0 * (cpu1 - cpu0) / elapsed,
        rss_mib: rss,
    };
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    print_table(
        &[
            "GPUs",
            "seconds",
            "agent CPU (% of one core)",
            "agent RSS MiB",
        ],
        &[vec![
            result.gpus.to_string(),
            format!("{:.0}", result.seconds),
            format!("{:.3}", result.cpu_percent_of_one_core),
            format!("{:.1}", result.rss_mib),
        ]],
    );
    Ok(())
}
