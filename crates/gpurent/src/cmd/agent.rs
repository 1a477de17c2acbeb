//! `gpurent agent`: a node agent that joins a control plane.

use std::sync::Arc;

use anyhow::{bail, Context};
use gpurent_agent::executor::SimExecutor;
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{Agent, AgentConfig, Executor, GpuBackend};
use tokio::sync::watch;

use crate::cli::{AgentArgs, ExecutorKind};

pub async fn run(args: AgentArgs, server: &str) -> anyhow::Result<()> {
    super::ensure_dir(&args.data_dir)?;
    let name = args.name.clone().unwrap_or_else(host_name);
    let (gpus, executor) = backends(args.sim_gpus.as_deref(), args.executor, &name)?;
    let mut config = AgentConfig::new(server, args.data_dir.clone(), &name);
    config.join_token = args.join_token.clone();
    let agent = Agent::new(config, gpus, executor);
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(agent.run(stopped));
    tokio::select! {
        r = super::shutdown_signal() => r?,
        r = wait_agent(&task) => return r,
    }
    let _ = stop.send(true);
    task.await
        .context("the agent task failed")?
        .context("the agent failed")?;
    Ok(())
}

async fn wait_agent(
    task: &tokio::task::JoinHandle<Result<(), gpurent_agent::AgentError>>,
) -> anyhow::Result<()> {
    while !task.is_finished() {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    bail!("the agent stopped; see the log above")
}

/// Picks the GPU backend and the executor, and says which.
pub fn backends(
    sim_gpus: Option<&str>,
    executor: ExecutorKind,
    node_name: &str,
) -> anyhow::Result<(Arc<dyn GpuBackend>, Arc<dyn Executor>)> {
    let spec = match sim_gpus {
        Some(spec) => spec.to_owned(),
        None => {
            tracing::warn!("no NVML backend in this build yet: using simulated GPUs 2xRTX4090 (pass --sim-gpus to choose)");
            "2xRTX4090".to_owned()
        }
    };
    let gpus: Arc<dyn GpuBackend> = Arc::new(SimGpus::parse(&spec, node_name)?);
    let executor: Arc<dyn Executor> = match executor {
        ExecutorKind::Auto | ExecutorKind::Sim => Arc::new(SimExecutor::new()),
        ExecutorKind::Docker | ExecutorKind::Process => {
            bail!("the {executor:?} executor is not in this build yet; use --executor sim")
        }
    };
    tracing::info!(
        gpu_backend = gpus.name(),
        executor = executor.name(),
        "node backends chosen"
    );
    Ok((gpus, executor))
}

pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_owned())
}
