//! `gpurent agent`: a node agent that joins a control plane.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use gpurent_agent::executor::docker::{engine_socket, CONNECT_TIMEOUT};
use gpurent_agent::executor::{
    ByImageExecutor, DockerExecutor, GpuLimits, HostCapacity, Isolation, ProcessExecutor,
    ResourcesPerGpu, Scratch, SimExecutor,
};
use gpurent_agent::gpu::{FakeNvml, NvmlGpus, SimGpus};
use gpurent_agent::tls::ClientTls;
use gpurent_agent::{Agent, AgentConfig, Executor, GpuBackend};
use tokio::sync::watch;

use crate::cli::{AgentArgs, ExecutorKind, LivenessArgs, NodeArgs};

pub async fn run(mut args: AgentArgs, server: &str, tls: ClientTls) -> anyhow::Result<()> {
    args.data_dir = absolute(&args.data_dir)?;
    absolute_node_paths(&mut args.node)?;
    super::private::agent_data_dir(&args.data_dir)?;
    if server.starts_with("https://") {
        // Settings that cannot work fail here, before the agent starts.
        tls.client_config()
            .context("the TLS settings (--ca-cert, --tls-fingerprint) are not usable")?;
    }
    let name = args.name.clone().unwrap_or_else(host_name);
    let volumes = volume_store(&args.node, &args.data_dir)?;
    let (gpus, executor) =
        backends(&args.node, &name, &args.data_dir, &[], false, &volumes).await?;
    let mut config = AgentConfig::new(server, args.data_dir.clone(), &name);
    config.join_token = args.join_token.clone();
    config.tls = tls;
    configure_node(&mut config, &args.liveness, &args.node, volumes);
    let agent = Agent::new(config, gpus, executor);
    let (stop, stopped) = watch::channel(false);
    if let Some(listen) = args.metrics_listen {
        gpurent_agent::metrics::serve(listen, agent.metrics(), stopped.clone()).await?;
    }
    let mut task = tokio::spawn(agent.run(stopped));
    tokio::select! {
        r = stop_signal() => r?,
        // Stopped unasked: its error (a refused registration, say) is the reason to print.
        r = &mut task => {
            r.context("the agent task failed")?.context("the agent failed")?;
            bail!("the agent stopped unasked");
        }
    }
    let _ = stop.send(true);
    task.await
        .context("the agent task failed")?
        .context("the agent failed")?;
    Ok(())
}

/// Waits for SIGINT or SIGTERM. A SIGHUP (a service manager's reload) changes nothing, and
/// says so: the agent's settings take a restart.
async fn stop_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    let stop = super::shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            r = &mut stop => return r,
            _ = hup.recv() => tracing::warn!(
                "SIGHUP: the agent reloads nothing; restart it to apply a changed configuration"
            ),
        }
    }
}

/// The agent's node flags: its heartbeat, and its lease (`--lease-secs`, else a heartbeat less
/// than the node TTL, so that an agent cut off from the control plane stops its work before the
/// control plane reschedules it); burn-in; checkpoint volumes.
pub fn configure_node(
    config: &mut AgentConfig,
    liveness: &LivenessArgs,
    node: &NodeArgs,
    volumes: gpurent_agent::volumes::VolumeStore,
) {
    config.heartbeat = liveness.heartbeat();
    config.lease = node
        .lease_secs
        .map_or_else(|| liveness.default_lease(), std::time::Duration::from_secs);
    // Half of what is left of the node TTL after the lease: a fenced instance is down before
    // the control plane starts it elsewhere.
    config.fence_grace = liveness.node_ttl().saturating_sub(config.lease) / 2;
    config.burn_in = node
        .burn_in_command
        .clone()
        .map(|command| gpurent_agent::BurnInConfig {
            command,
            every: std::time::Duration::from_secs(node.burn_in_every_mins * 60),
            length: std::time::Duration::from_secs(node.burn_in_mins * 60),
        });
    if let Some(dir) = &node.checkpoint_dir {
        config.checkpoint.root.clone_from(dir);
    }
    config.checkpoint.hook.clone_from(&node.checkpoint_hook);
    config.checkpoint.keep = std::time::Duration::from_secs(node.checkpoint_keep_days * 24 * 3600);
    config.vram_grace = std::time::Duration::from_secs(node.vram_grace_secs);
    config.volumes = Some(volumes);
    config.prepull.clone_from(&node.prepull);
}

/// The node's store of volumes and instance disks: `--volumes-dir` (default DATA_DIR/volumes)
/// and `--shared-volumes-dir`.
pub fn volume_store(
    node: &NodeArgs,
    data_dir: &Path,
) -> anyhow::Result<gpurent_agent::volumes::VolumeStore> {
    let dir = node
        .volumes_dir
        .clone()
        .unwrap_or_else(|| data_dir.join("volumes"));
    gpurent_agent::volumes::VolumeStore::open(dir, node.shared_volumes_dir.clone())
        .context("the volumes dirs are not usable (--volumes-dir, --shared-volumes-dir)")
}

/// Each instance's disk per GPU, in bytes: `--disk-per-gpu-gb`, else the volumes dir's free
/// disk divided among the GPUs, at most 100 GB; None: unbounded.
fn disk_per_gpu(
    node: &NodeArgs,
    gpus: usize,
    volumes: &gpurent_agent::volumes::VolumeStore,
) -> Option<u64> {
    const GB: u64 = 1_000_000_000;
    match node.disk_per_gpu_gb {
        Some(0) => None,
        Some(gb) => Some(gb.saturating_mul(GB)),
        None => {
            let free = volumes.free_bytes().ok()?;
            Some((free / u64::try_from(gpus.max(1)).unwrap_or(1)).min(100 * GB))
        }
    }
}

/// What instances are told of their GPU memory; with `--mps`, once the MPS control daemon
/// answered (else the agent does not start).
async fn gpu_limits(node: &NodeArgs, gpus: &dyn GpuBackend) -> anyhow::Result<GpuLimits> {
    if node.mps {
        gpurent_agent::mps::check().await?;
        tracing::info!("the MPS control daemon answers: shares get MPS limits");
    }
    let memory_mb = gpus
        .discover()?
        .into_iter()
        .map(|g| (g.uuid, g.vram_mb))
        .collect();
    Ok(GpuLimits {
        memory_mb,
        mps: node.mps,
    })
}

/// Picks the GPU backend and the executor, and says which. Without `--sim-gpus`, real GPUs
/// are found through NVML; `up` (with `sim_fallback`) falls back to simulated ones. `secret`:
/// directories besides the agent's data dir that instances must never see.
pub async fn backends(
    node: &NodeArgs,
    node_name: &str,
    data_dir: &Path,
    secret: &[&Path],
    sim_fallback: bool,
    volumes: &gpurent_agent::volumes::VolumeStore,
) -> anyhow::Result<(Arc<dyn GpuBackend>, Arc<dyn Executor>)> {
    let gpus: Arc<dyn GpuBackend> = match (&node.sim_gpus, &node.fake_nvml) {
        (Some(spec), _) => Arc::new(SimGpus::parse(spec, node_name)?),
        (None, Some(path)) => Arc::new(FakeNvml::load(path)?),
        (None, None) => match NvmlGpus::load() {
            Ok(nvml) => Arc::new(nvml),
            Err(e) if sim_fallback => {
                tracing::warn!(error = %e, "no GPU found through NVML: simulating 2xRTX4090 (choose with --sim-gpus)");
                Arc::new(SimGpus::parse("2xRTX4090", node_name)?)
            }
            Err(e) => return Err(e).context("no GPUs (pass --sim-gpus to simulate some)"),
        },
    };
    let resources = fitted_resources(node, gpus.as_ref());
    // Containers get the GPUs through the NVIDIA runtime only when they are real.
    let real_gpus = gpus.name() == "nvml";
    let limits = gpu_limits(node, gpus.as_ref()).await?;
    let disk = disk_per_gpu(node, gpus.discover()?.len(), volumes);
    // SFTP sessions run this binary's hidden `instance-sftp`.
    let helper =
        std::env::current_exe().context("cannot find this binary's path (SFTP sessions run it)")?;
    let process = || -> Result<Arc<dyn Executor>, gpurent_agent::AgentError> {
        let isolation = Isolation {
            cgroup_root: node.cgroup_root.clone(),
            uid_base: node.instance_uid_base,
            allow_unisolated: node.allow_unisolated,
            hidden: secret
                .iter()
                .map(|p| p.to_path_buf())
                .chain(node.checkpoint_dir.clone())
                .chain(node.volumes_dir.clone())
                .chain(node.shared_volumes_dir.clone())
                .collect(),
        };
        let mut executor = ProcessExecutor::isolated(data_dir, &isolation, resources)?
            .with_entry_helper(helper.clone())
            .with_gpu_limits(limits.clone());
        if node.shared_network {
            executor = executor.with_shared_network();
        }
        if let Some(per_gpu) = disk {
            match Scratch::new(volumes.clone(), per_gpu) {
                Ok(scratch) if executor.is_isolated() => {
                    tracing::info!(per_gpu_bytes = per_gpu, "each instance's disk is bounded");
                    executor = executor.with_scratch(scratch);
                }
                Ok(_) => {}
                Err(why) => {
                    tracing::warn!(%why, "instances' disks are UNBOUNDED: a tenant can fill this node's disk");
                }
            }
        }
        Ok(Arc::new(executor))
    };
    let executor: Arc<dyn Executor> = match node.executor {
        ExecutorKind::Sim => Arc::new(SimExecutor::new()),
        ExecutorKind::Process => process()?,
        ExecutorKind::Docker => Arc::new(
            DockerExecutor::connect(resources, real_gpus)
                .await
                .context("the docker executor needs a Docker Engine on its local socket")?
                .scoped(node_name)
                .with_entry_helper(helper.clone())
                .with_gpu_limits(limits.clone())
                .with_disk(disk),
        ),
        // Simulated GPUs too run real work: `auto` never picks the sim executor (a demo whose
        // `-- echo hi` printed nothing taught the wrong thing).
        ExecutorKind::Auto => {
            let socket = engine_socket().unwrap_or_else(|why| why);
            let docker = tokio::time::timeout(
                CONNECT_TIMEOUT,
                DockerExecutor::connect(resources, real_gpus),
            )
            .await;
            match docker {
                Ok(Ok(docker)) => with_docker(
                    Arc::new(
                        docker
                            .scoped(node_name)
                            .with_entry_helper(helper.clone())
                            .with_gpu_limits(limits.clone())
                            .with_disk(disk),
                    ),
                    &socket,
                    node.mps,
                    process,
                ),
                Ok(Err(e)) => process_without_docker(e.to_string(), process)?,
                Err(_) => process_without_docker(
                    format!(
                        "the Docker Engine on {socket} did not answer within {CONNECT_TIMEOUT:?}"
                    ),
                    process,
                )?,
            }
        }
    };
    if node.mps && executor.name() == "process" && executor.isolated() {
        // MPS serves one user at a time: a client of another uid waits until every client of
        // the running server is done, and the isolated process executor runs each instance as
        // a uid of its own.
        bail!("--mps does not work with the isolated process executor: MPS serves one uid at a time, so each share would wait for the others to end; use the docker executor (instances of one uid) or run without --mps");
    }
    tracing::info!(
        gpu_backend = gpus.name(),
        executor = executor.name(),
        isolated = executor.isolated(),
        shared_network = executor.shared_network(),
        "node backends chosen"
    );
    Ok((gpus, executor))
}

/// `auto` where a Docker Engine answers on `socket`: instances with an image run as
/// containers, the others as processes where the process executor can isolate them (or
/// `--allow-unisolated` says they may run unisolated), said at start. Docker alone where it
/// cannot (an instance without an image then fails saying it needs one) and with `--mps`
/// (MPS serves one uid at a time, and isolated processes each run as a uid of their own).
fn with_docker(
    docker: Arc<dyn Executor>,
    socket: &str,
    mps: bool,
    process: impl FnOnce() -> Result<Arc<dyn Executor>, gpurent_agent::AgentError>,
) -> Arc<dyn Executor> {
    if mps {
        tracing::info!(
            "a Docker Engine answers on {socket}: running instances as containers (with --mps \
             instances without an image cannot run: MPS serves one uid at a time)"
        );
        return docker;
    }
    match process() {
        Ok(processes) => {
            tracing::info!(
                "a Docker Engine answers on {socket}: instances with an image run as containers, \
                 others as {} processes",
                if processes.isolated() {
                    "isolated"
                } else {
                    "UNISOLATED"
                }
            );
            Arc::new(ByImageExecutor::new(docker, processes))
        }
        Err(e) => {
            tracing::info!(
                "a Docker Engine answers on {socket}: running instances as containers (instances \
                 without an image cannot run: {e})"
            );
            docker
        }
    }
}

/// `auto` where no Docker Engine answers (`no_docker` says why): the process executor, said at
/// start; where it cannot isolate instances either, an error saying both and what to do.
fn process_without_docker(
    no_docker: String,
    process: impl FnOnce() -> Result<Arc<dyn Executor>, gpurent_agent::AgentError>,
) -> anyhow::Result<Arc<dyn Executor>> {
    match process() {
        Ok(executor) => {
            tracing::info!(
                "{no_docker}: running instances as {} processes (the process executor)",
                if executor.isolated() {
                    "isolated"
                } else {
                    "UNISOLATED"
                }
            );
            Ok(executor)
        }
        Err(e) => bail!("{no_docker}, and {e}"),
    }
}

/// What each reserved GPU brings to its instance: the flags, at most the host's cores and
/// memory divided among its GPUs (Docker refuses a CPU quota over the host's cores: 4 CPUs per
/// GPU on a 2-core host failed every start). Said in the log when the host clamps them.
fn fitted_resources(node: &NodeArgs, gpus: &dyn GpuBackend) -> ResourcesPerGpu {
    let asked = ResourcesPerGpu {
        milli_cpus: node.cpus_per_gpu.saturating_mul(1000),
        memory_mb: node.memory_per_gpu_gb.saturating_mul(1024),
        ..ResourcesPerGpu::default()
    };
    let count = gpus.discover().map_or(1, |g| g.len().max(1));
    let Some(host) = HostCapacity::detect() else {
        tracing::warn!("cannot read this host's cores and memory: instance limits are the flags'");
        return asked;
    };
    let fitted = asked.fit(host, count);
    let limits = fitted.for_instance(1);
    if fitted == asked {
        tracing::info!(
            "instance limits per GPU: {} CPU and {} MiB (--cpus-per-gpu, --memory-per-gpu-gb)",
            limits.cpus_text(),
            limits.memory_mb()
        );
    } else {
        tracing::info!(
            "instance limits per GPU: {} CPU and {} MiB, the host's {} cores and {} MiB divided \
             among its {count} GPUs (asked: --cpus-per-gpu {} --memory-per-gpu-gb {})",
            limits.cpus_text(),
            limits.memory_mb(),
            host.cpus(),
            host.memory_mb,
            node.cpus_per_gpu,
            node.memory_per_gpu_gb
        );
    }
    fitted
}

pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_owned())
}

/// `path` from the root: what the agent hands its executors (the sandbox's mounts, the
/// wrapper's files) must not depend on a working directory (`./gpurent-data` by default).
pub(crate) fn absolute(path: &Path) -> anyhow::Result<std::path::PathBuf> {
    std::path::absolute(path)
        .with_context(|| format!("cannot make {} an absolute path", path.display()))
}

/// The node's directories, from the root (see `absolute`).
pub(crate) fn absolute_node_paths(node: &mut NodeArgs) -> anyhow::Result<()> {
    node.cgroup_root = absolute(&node.cgroup_root)?;
    for dir in [
        &mut node.checkpoint_dir,
        &mut node.volumes_dir,
        &mut node.shared_volumes_dir,
    ] {
        if let Some(d) = dir.as_deref() {
            *dir = Some(absolute(d)?);
        }
    }
    Ok(())
}
