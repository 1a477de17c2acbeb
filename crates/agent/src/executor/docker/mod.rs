//! The Docker executor: each reservation runs as one container, created through the Engine API
//! (bollard over the unix socket) with its GPUs by UUID (a `DeviceRequest` for the `nvidia`
//! driver, as `--gpus device=UUID` makes), hard and soft memory limits, a CPU quota, a pids
//! limit, every capability dropped, `no-new-privileges`, never privileged and never the Docker
//! socket. Labels tie each container to its reservation and epoch, so a restarted agent finds
//! (adopts) its containers instead of starting them again. A stopped container is kept,
//! renamed (`kept_name`), until the agent has shipped its output (`forget_output`). How a
//! container is made is `create`, how one is entered `enter`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::{ContainerSummary, ContainerSummaryStateEnum};
use bollard::query_parameters::{
    InspectContainerOptions, ListContainersOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, RenameContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use gpurent_types::agent::{Assignment, PublishedPort};

use super::{Executor, GpuLimits, ResourcesPerGpu};
use crate::entry::{Entered, EntryError, EntryRequest};
use crate::reconcile::{Observed, ObservedState};
use crate::AgentError;

mod create;
mod disk;
mod enter;
mod pull;

pub use pull::{LABEL_PULL, LABEL_PULL_LOG};

pub const LABEL_MANAGED: &str = "io.gpurent.managed";
pub const LABEL_RESERVATION: &str = "io.gpurent.reservation";
pub const LABEL_EPOCH: &str = "io.gpurent.epoch";
/// Which agent a container is for (its node's name): agents sharing one Engine (several
/// on a host, or tests side by side) each see only their own.
pub const LABEL_SCOPE: &str = "io.gpurent.scope";

#[derive(Debug, Clone)]
pub struct DockerExecutor {
    docker: Docker,
    resources: ResourcesPerGpu,
    /// Ask the Engine for the GPUs (needs the NVIDIA container toolkit); off for simulated GPUs.
    gpu_devices: bool,
    /// Seconds between SIGTERM and SIGKILL when a container is stopped and its assignment does
    /// not say.
    grace_s: i32,
    /// The `LABEL_SCOPE` of this executor's containers; None: every gpurent container.
    scope: Option<String>,
    /// The binary whose `instance-sftp` serves SFTP sessions.
    entry_helper: PathBuf,
    /// What containers are told of their GPU memory.
    gpu_limits: GpuLimits,
    /// Each container's writable layer, bytes per GPU (`--disk-per-gpu-gb`): bounded by the
    /// Engine where its storage driver can, else watched.
    disk: disk::DiskWatch,
    /// Images being pulled for instances (shared by clones: the pull's task holds one).
    pulls: pull::Pulls,
    /// The pull lines of containers whose image was pulled, by container name, as `list`
    /// last saw their labels (so that reading output asks the Engine nothing more).
    pull_logs: std::sync::Arc<std::sync::Mutex<HashMap<String, String>>>,
}

fn docker_error(action: &'static str, id: &str, e: impl std::fmt::Display) -> AgentError {
    AgentError::Executor {
        executor: "docker",
        action,
        reservation_id: id.to_owned(),
        message: e.to_string(),
    }
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// What the Engine said when it would not create or start a container, in words a tenant
/// reads in `gpurent get` (`end_message`): a missing image, a refused limit.
fn refusal(action: &str, image: &str, e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            message,
        } if action == "create" => {
            format!("the image {image} is not on this node (Docker: {message})")
        }
        bollard::errors::Error::DockerResponseServerError { message, .. } => {
            format!("Docker refused to {action} the container: {message}")
        }
        other => format!("Docker did not {action} the container: {other}"),
    }
}

/// How long past the grace period a stop request may take (the kill and the Engine's answer).
const STOP_SLACK: Duration = Duration::from_secs(30);

/// The container of a reservation.
pub fn container_name(reservation_id: &str) -> String {
    format!("gpurent-{reservation_id}")
}

/// The name a stopped container is kept by while its output is shipped (no reservation's
/// container is named so: `gpurent.` is not `gpurent-`).
pub fn kept_name(reservation_id: &str) -> String {
    format!("gpurent.stopped-{reservation_id}")
}

/// Whether the container (as the Engine lists its names, `/NAME`) is a kept one.
fn is_kept(c: &ContainerSummary) -> bool {
    c.names
        .iter()
        .flatten()
        .any(|n| n.trim_start_matches('/').starts_with("gpurent.stopped-"))
}

/// The reservation and epoch a container's labels say.
fn labelled(c: &ContainerSummary) -> Option<(String, i64)> {
    let labels = c.labels.as_ref()?;
    Some((
        labels.get(LABEL_RESERVATION)?.clone(),
        labels.get(LABEL_EPOCH)?.parse().ok()?,
    ))
}

impl DockerExecutor {
    /// Connects to the Engine on its local socket (`engine_socket`) and agrees on an API
    /// version. Err when no Engine answers.
    pub async fn connect(
        resources: ResourcesPerGpu,
        gpu_devices: bool,
    ) -> Result<Self, AgentError> {
        let socket = engine_socket().map_err(|message| AgentError::NoDockerEngine {
            socket: std::env::var("DOCKER_HOST").unwrap_or_default(),
            message,
        })?;
        let fail = |e: bollard::errors::Error| AgentError::NoDockerEngine {
            socket: socket.clone(),
            message: e.to_string(),
        };
        let docker = Docker::connect_with_socket(&socket, 120, bollard::API_DEFAULT_VERSION)
            .map_err(fail)?;
        let docker = docker.negotiate_version().await.map_err(fail)?;
        docker.ping().await.map_err(fail)?;
        Ok(DockerExecutor {
            docker,
            resources,
            gpu_devices,
            grace_s: 10,
            scope: None,
            entry_helper: crate::entry::sftp::default_helper(),
            gpu_limits: GpuLimits::default(),
            disk: disk::DiskWatch::default(),
            pulls: pull::Pulls::default(),
            pull_logs: Default::default(),
        })
    }

    /// Bounds each container's writable layer to this many bytes per GPU: by the Engine
    /// where it can, else by a watch that stops a container grown past it.
    pub fn with_disk(mut self, per_gpu: Option<u64>) -> Self {
        self.disk = disk::DiskWatch::new(per_gpu);
        self
    }

    /// Only this agent's containers (`scope`: its node's name, the same after a restart, so
    /// that it adopts what it ran). Containers made before scopes existed are still adopted.
    pub fn scoped(mut self, scope: &str) -> Self {
        self.scope = Some(scope.to_owned());
        self
    }

    pub fn with_grace(mut self, seconds: i32) -> Self {
        self.grace_s = seconds;
        self
    }

    /// The binary whose hidden `instance-sftp` subcommand serves SFTP sessions (by default
    /// the agent's own).
    pub fn with_entry_helper(mut self, helper: PathBuf) -> Self {
        self.entry_helper = helper;
        self
    }

    /// What containers are told of their GPU memory (`GPURENT_VRAM_LIMIT_MB`, MPS limits).
    pub fn with_gpu_limits(mut self, limits: GpuLimits) -> Self {
        self.gpu_limits = limits;
        self
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// Every container gpurent made on this Engine, stopped ones included.
    async fn managed(&self) -> Result<Vec<ContainerSummary>, AgentError> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_MANAGED}=true")])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let all = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| docker_error("list", "-", e))?;
        let Some(scope) = &self.scope else {
            return Ok(all);
        };
        Ok(all
            .into_iter()
            .filter(|c| {
                c.labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_SCOPE))
                    .is_none_or(|s| s == scope)
            })
            .collect())
    }

    /// Removes a container; what is gone, or being removed already, is no error.
    async fn remove(&self, id: &str, name: &str) -> Result<(), AgentError> {
        let remove = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(name, Some(remove)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            // 409: another stop of the same container (a retry, or a second reconcile while the
            // first still waits) is already removing it.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message,
            }) if message.contains("already in progress") => Ok(()),
            Err(e) => Err(docker_error("remove", id, e)),
        }
    }

    /// The output of a container, up to `upto` bytes of it (all where None); None when there
    /// is no such container.
    async fn logs_of(
        &self,
        id: &str,
        name: &str,
        upto: Option<u64>,
    ) -> Result<Option<Vec<u8>>, AgentError> {
        use futures_util::StreamExt;
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .follow(false)
            .build();
        let mut stream = self.docker.logs(name, Some(options));
        let mut all = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(output) => all.extend_from_slice(&output.into_bytes()),
                Err(e) if is_not_found(&e) => return Ok(None),
                Err(e) => return Err(docker_error("read the output of", id, e)),
            }
            if upto.is_some_and(|upto| all.len() as u64 >= upto) {
                break;
            }
        }
        Ok(Some(all))
    }

    /// The output of the reservation's container, else of its kept one, after the lines of
    /// the pull of its image (kept in a label); while the image is pulled, those lines alone.
    async fn output(&self, id: &str, upto: Option<u64>) -> Result<Option<Vec<u8>>, AgentError> {
        for name in [container_name(id), kept_name(id)] {
            if let Some(all) = self.logs_of(id, &name, upto).await? {
                // A container just made by its pull's task may not be listed yet: its pull's
                // own lines then (the label holds the same).
                let prefix = self
                    .pull_log_of(&name)
                    .or_else(|| self.pulls.log(id))
                    .unwrap_or_default();
                let mut out = prefix.into_bytes();
                out.extend_from_slice(&all);
                return Ok(Some(out));
            }
        }
        Ok(self.pulls.log(id).map(String::into_bytes))
    }

    async fn exit_code(&self, name: &str) -> Option<i64> {
        let inspect = self
            .docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .ok()?;
        inspect.state?.exit_code
    }
}

impl DockerExecutor {
    /// Stops the reservation's container and keeps it (renamed) while its output is shipped.
    async fn stop_container(&self, id: &str, grace: Option<Duration>) -> Result<(), AgentError> {
        let name = container_name(id);
        let grace_s = grace.map_or(self.grace_s, |g| {
            i32::try_from(g.as_secs()).unwrap_or(i32::MAX)
        });
        let stop = StopContainerOptionsBuilder::default().t(grace_s).build();
        // The Engine answers only once the container is down, up to the grace period later:
        // the request may take that long (the client's timeout, 2 minutes, could be shorter).
        let wait = Duration::from_secs(u64::try_from(grace_s).unwrap_or(0)) + STOP_SLACK;
        let docker = self
            .docker
            .clone()
            .with_timeout(wait.max(self.docker.timeout()));
        match docker.stop_container(&name, Some(stop)).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => return Ok(()),
            // 304: already stopped.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => {}
            Err(e) => return Err(docker_error("stop", id, e)),
        }
        // Kept under another name (in place of what an earlier stop kept), out of `list`,
        // while its output is shipped.
        self.remove(id, &kept_name(id)).await?;
        let rename = RenameContainerOptionsBuilder::default()
            .name(&kept_name(id))
            .build();
        match self.docker.rename_container(&name, rename).await {
            Ok(()) => return Ok(()),
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => {
                tracing::warn!(reservation_id = %id, error = %e, "cannot keep a stopped container; what it wrote since the last sync is lost");
            }
        }
        self.remove(id, &name).await
    }
}

#[async_trait]
impl Executor for DockerExecutor {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn runs_containers(&self) -> bool {
        true
    }

    async fn start(&self, a: &Assignment, volume: Option<&Path>) -> Result<(), AgentError> {
        self.create_and_start(a, volume, &[]).await
    }

    async fn start_with(
        &self,
        a: &Assignment,
        volume: Option<&Path>,
        binds: &[super::Bind],
    ) -> Result<(), AgentError> {
        self.create_and_start(a, volume, binds).await
    }

    async fn stop(&self, id: &str, grace: Option<Duration>) -> Result<(), AgentError> {
        // A pull under way for it stops too.
        self.pulls.cancel(id);
        self.stop_container(id, grace).await
    }

    async fn kept_outputs(&self) -> Result<Vec<(String, i64)>, AgentError> {
        let mut kept: Vec<(String, i64)> = self
            .managed()
            .await?
            .iter()
            .filter(|c| is_kept(c))
            .filter_map(labelled)
            .collect();
        // A failed pull's lines are its instance's output.
        kept.extend(self.pulls.failed());
        Ok(kept)
    }

    async fn forget_output(&self, id: &str, epoch: i64) -> Result<(), AgentError> {
        self.pulls.done(id, epoch);
        self.disk.forget(id, epoch);
        let name = kept_name(id);
        let inspect = match self
            .docker
            .inspect_container(&name, None::<InspectContainerOptions>)
            .await
        {
            Ok(inspect) => inspect,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(docker_error("inspect", id, e)),
        };
        // Kept of another epoch: not this one's to forget.
        let kept_epoch = inspect
            .config
            .and_then(|c| c.labels)
            .and_then(|l| l.get(LABEL_EPOCH).and_then(|e| e.parse::<i64>().ok()));
        if kept_epoch.is_some_and(|e| e != epoch) {
            return Ok(());
        }
        self.remove(id, &name).await
    }

    async fn list(&self) -> Result<Vec<Observed>, AgentError> {
        let mut observed = Vec::new();
        let containers = self.managed().await?;
        self.note_pull_logs(&containers);
        for c in containers {
            // A kept container is stopped and gone as far as the agent's plan goes.
            if is_kept(&c) {
                continue;
            }
            let Some((id, epoch)) = labelled(&c) else {
                continue;
            };
            let state = match c.state {
                Some(
                    ContainerSummaryStateEnum::RUNNING
                    | ContainerSummaryStateEnum::RESTARTING
                    | ContainerSummaryStateEnum::PAUSED,
                ) => ObservedState::Running,
                // Created but not started yet: the start is in flight or failed half-way.
                Some(ContainerSummaryStateEnum::CREATED) => ObservedState::Running,
                _ => {
                    let code = self.exit_code(&container_name(&id)).await.unwrap_or(-1);
                    ObservedState::Exited(i32::try_from(code).unwrap_or(-1))
                }
            };
            if c.labels
                .as_ref()
                .is_some_and(|l| l.contains_key(disk::LABEL_DISK))
            {
                // Found after a restart: watched again.
                self.ensure_disk_watch();
            }
            let pull = c
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_PULL))
                .and_then(|j| serde_json::from_str(j).ok());
            observed.push(Observed {
                reservation_id: id,
                epoch,
                state,
                pull,
            });
        }
        // Instances the disk watch stopped: failed, saying why (their output is kept).
        for (id, epoch, why) in self.disk.overgrown() {
            if !observed.iter().any(|o| o.reservation_id == id) {
                observed.push(Observed {
                    reservation_id: id,
                    epoch,
                    state: ObservedState::Failed(why),
                    pull: None,
                });
            }
        }
        // Instances whose image is being pulled, or whose pull failed: no container yet.
        for (id, epoch, pull) in self.pulls.observed() {
            if observed.iter().any(|o| o.reservation_id == id) {
                continue;
            }
            let state = match pull {
                Ok(progress) => ObservedState::Pulling(progress),
                Err(why) => ObservedState::Failed(why),
            };
            observed.push(Observed {
                reservation_id: id,
                epoch,
                state,
                pull: None,
            });
        }
        Ok(observed)
    }

    /// The Engine keeps the output; it is read whole and cut at `offset` (outputs are capped
    /// by the control plane, so this stays bounded).
    async fn read_output(
        &self,
        id: &str,
        offset: u64,
        max: usize,
    ) -> Result<Option<Vec<u8>>, AgentError> {
        let Some(all) = self
            .output(id, Some(offset.saturating_add(max as u64)))
            .await?
        else {
            return Ok(None);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(all.len());
        let end = start.saturating_add(max).min(all.len());
        Ok(Some(all[start..end].to_vec()))
    }

    async fn output_size(&self, id: &str) -> Result<Option<u64>, AgentError> {
        Ok(self.output(id, None).await?.map(|all| all.len() as u64))
    }

    async fn disk_usage(&self, reservation_id: &str) -> Option<gpurent_types::agent::DiskUse> {
        self.disk.usage(reservation_id)
    }

    async fn changed(&self) {
        self.pulls.ended().await;
    }

    async fn images(&self) -> Vec<String> {
        self.image_tags().await
    }

    async fn prepull(&self, images: &[String]) {
        for image in images {
            self.prepull_one(image);
        }
    }

    async fn published_ports(&self, a: &Assignment) -> Vec<PublishedPort> {
        if a.ports.is_empty() {
            return Vec::new();
        }
        let Ok(inspect) = self
            .docker
            .inspect_container(
                &container_name(&a.reservation_id),
                None::<InspectContainerOptions>,
            )
            .await
        else {
            return Vec::new();
        };
        let map = inspect
            .network_settings
            .and_then(|n| n.ports)
            .unwrap_or_default();
        a.ports
            .iter()
            .filter_map(|&p| {
                let bindings = map.get(&format!("{p}/tcp"))?.as_ref()?;
                let host_port = bindings
                    .iter()
                    .find_map(|b| b.host_port.as_deref()?.parse().ok())?;
                Some(PublishedPort {
                    container_port: p,
                    host_port,
                })
            })
            .collect()
    }

    async fn enter(&self, id: &str, request: EntryRequest) -> Result<Entered, EntryError> {
        self.enter_container(id, request).await
    }

    async fn owner_of(&self, pid: u32) -> Option<String> {
        // The container's id is in the process's cgroup path (…/docker/<id> or docker-<id>.scope).
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let container = cgroup
            .split(['/', '-', '.', '\n', ':'])
            .find(|part| part.len() == 64 && part.bytes().all(|b| b.is_ascii_hexdigit()))?;
        let inspect = self
            .docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
            .ok()?;
        inspect.config?.labels?.get(LABEL_RESERVATION).cloned()
    }
}

/// The Engine's unix socket: `DOCKER_HOST` when it names one (`unix:///PATH`), else
/// `/var/run/docker.sock`. Err for another kind of `DOCKER_HOST` (the agent speaks to a local
/// Engine only: its containers are this node's).
pub fn engine_socket() -> Result<String, String> {
    match std::env::var("DOCKER_HOST") {
        Err(_) => Ok("/var/run/docker.sock".to_owned()),
        Ok(host) if host.is_empty() => Ok("/var/run/docker.sock".to_owned()),
        Ok(host) => host.strip_prefix("unix://").map(str::to_owned).ok_or_else(|| {
            format!("DOCKER_HOST={host} is not a unix socket (unix:///PATH); the docker executor uses the local Engine only")
        }),
    }
}

/// How long to wait for the Engine to answer at start-up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
