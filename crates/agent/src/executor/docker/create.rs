//! How a reservation's container is made: its environment and labels, its limits and GPUs
//! (`host_config`), its published ports and its checkpoint volume; then created and started.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, PortBinding};
use bollard::query_parameters::CreateContainerOptionsBuilder;
use gpurent_types::agent::Assignment;

use super::{
    container_name, docker_error, refusal, DockerExecutor, LABEL_EPOCH, LABEL_MANAGED,
    LABEL_RESERVATION, LABEL_SCOPE,
};
use crate::AgentError;

/// Where a container sees its checkpoint volume.
const CHECKPOINT_MOUNT: &str = "/checkpoint";

impl DockerExecutor {
    pub(super) fn host_config(&self, a: &Assignment) -> HostConfig {
        let limits = self.resources.for_instance(a.gpus.len());
        let memory = i64::try_from(limits.memory_bytes).unwrap_or(i64::MAX);
        HostConfig {
            memory: Some(memory),
            // The soft limit the kernel reclaims down to under memory pressure.
            memory_reservation: Some(memory / 4 * 3),
            // No swap beyond the memory limit.
            memory_swap: Some(memory),
            nano_cpus: Some(i64::from(limits.milli_cpus).saturating_mul(1_000_000)),
            pids_limit: Some(i64::try_from(limits.pids).unwrap_or(i64::MAX)),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            privileged: Some(false),
            // Never the host's network, processes or IPC (the Docker socket is never mounted:
            // the only bind is the checkpoint volume).
            network_mode: Some("bridge".to_owned()),
            ipc_mode: Some("private".to_owned()),
            pid_mode: None,
            device_requests: self.gpu_devices.then(|| {
                vec![DeviceRequest {
                    driver: Some("nvidia".to_owned()),
                    device_ids: Some(a.gpus.clone()),
                    capabilities: Some(vec![vec!["gpu".to_owned()]]),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    /// The container of an assignment, created and started; when the node lacks its image,
    /// the image is pulled first, in the background (the instance is `starting` meanwhile).
    pub(super) async fn create_and_start(
        &self,
        a: &Assignment,
        volume: Option<&Path>,
        binds: &[crate::executor::Bind],
    ) -> Result<(), AgentError> {
        let id = &a.reservation_id;
        let image = a.image.clone().ok_or_else(|| {
            docker_error("start", id, "the docker executor needs an image (--image)")
        })?;
        // Created at once where the Engine has the image (no extra round trip to ask first).
        if !self.create_container(a, volume, binds, None).await? {
            self.pull_then_start(a, volume, binds, &image);
        }
        Ok(())
    }

    /// The container of an assignment, created and started (an earlier epoch's goes first),
    /// with the lines and final figures of its image's pull, if it was pulled, in labels.
    /// False, with nothing started, where the Engine does not have the image.
    pub(super) async fn create_container(
        &self,
        a: &Assignment,
        volume: Option<&Path>,
        binds: &[crate::executor::Bind],
        pulled: Option<(String, gpurent_types::agent::PullProgress)>,
    ) -> Result<bool, AgentError> {
        let id = &a.reservation_id;
        let image = a.image.clone().ok_or_else(|| {
            docker_error("start", id, "the docker executor needs an image (--image)")
        })?;
        let name = container_name(id);
        // A container left by an earlier epoch of this reservation goes first.
        self.stop_container(id, None).await?;
        let visible = a.gpus.join(",");
        // The reserved variables are the executor's alone: a tenant's copy is dropped rather
        // than left beside ours (the NVIDIA runtime reads NVIDIA_VISIBLE_DEVICES to pick the
        // GPUs a container gets).
        let mut env: Vec<String> = a
            .env
            .iter()
            .chain(&a.secrets.0)
            .filter(|(k, _)| !crate::executor::is_reserved_env(k))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("NVIDIA_VISIBLE_DEVICES={visible}"));
        env.push(format!("CUDA_VISIBLE_DEVICES={visible}"));
        env.push(format!("GPURENT_RESERVATION_ID={id}"));
        env.push(format!("GPURENT_EPOCH={}", a.epoch));
        env.push(format!("GPURENT_RESTART_COUNT={}", a.restart_count));
        if let Some(index) = a.array_index {
            env.push(format!("GPURENT_ARRAY_INDEX={index}"));
        }
        if let Some(m) = a.mounts.iter().find(|m| m.checkpoint) {
            env.push(format!("GPURENT_CHECKPOINT_DIR={}", m.path));
        }
        env.extend(
            self.gpu_limits
                .env(a)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}")),
        );
        for (k, v) in self.resources.for_instance(a.gpus.len()).env() {
            env.push(format!("{k}={v}"));
        }
        if volume.is_some() {
            env.push(format!("GPURENT_CHECKPOINT_DIR={CHECKPOINT_MOUNT}"));
        }
        let mut labels = HashMap::from([
            (LABEL_MANAGED.to_owned(), "true".to_owned()),
            (LABEL_RESERVATION.to_owned(), id.clone()),
            (LABEL_EPOCH.to_owned(), a.epoch.to_string()),
        ]);
        if let Some((log, progress)) = pulled {
            labels.insert(super::LABEL_PULL_LOG.to_owned(), log);
            if let Ok(json) = serde_json::to_string(&progress) {
                labels.insert(super::LABEL_PULL.to_owned(), json);
            }
        }
        if let Some(scope) = &self.scope {
            labels.insert(LABEL_SCOPE.to_owned(), scope.clone());
        }
        let exposed: Vec<String> = a.ports.iter().map(|p| format!("{p}/tcp")).collect();
        let mut host_config = self.host_config(a);
        let mut mounts = Vec::new();
        if let Some(volume) = volume {
            mounts.push(format!("{}:{CHECKPOINT_MOUNT}:rw", volume.display()));
        }
        if binds.iter().any(|b| !b.read_only) {
            // A volume it writes is the user its image runs as (no capability lets it write
            // another's files).
            let (uid, gid) = self.image_user(&image).await;
            for bind in binds.iter().filter(|b| !b.read_only) {
                crate::volumes::chown_tree(&bind.source, uid, gid).map_err(|e| {
                    docker_error("start", id, format!("chown {}: {e}", bind.source.display()))
                })?;
            }
        }
        for bind in binds {
            let mode = if bind.read_only { "ro" } else { "rw" };
            mounts.push(format!("{}:{}:{mode}", bind.source.display(), bind.target));
        }
        if !mounts.is_empty() {
            host_config.binds = Some(mounts);
        }
        if !exposed.is_empty() {
            // Each port on a free port of the node, chosen by the Engine.
            let bindings = exposed
                .iter()
                .map(|p| {
                    (
                        p.clone(),
                        Some(vec![PortBinding {
                            host_ip: Some("0.0.0.0".to_owned()),
                            host_port: Some(String::new()),
                        }]),
                    )
                })
                .collect();
            host_config.port_bindings = Some(bindings);
        }
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            exposed_ports: (!exposed.is_empty()).then_some(exposed),
            cmd: (!a.command.is_empty()).then(|| a.command.clone()),
            // No command: the image's own. Its stdin held open (`docker run -i`), so one
            // whose command is a shell waits for its owner instead of ending at once.
            open_stdin: a.command.is_empty().then_some(true),
            env: Some(env),
            labels: Some(labels),
            host_config: Some(host_config),
            ..Default::default()
        };
        let mut body = body;
        let disk = self.disk.size_for(a.gpus.len());
        let by_engine = disk.filter(|_| self.disk.engine_may());
        if let (Some(bytes), Some(hc)) = (by_engine, body.host_config.as_mut()) {
            hc.storage_opt = Some(HashMap::from([("size".to_owned(), bytes.to_string())]));
        }
        let label = |body: &mut ContainerCreateBody, by_engine: bool| {
            if let (Some(bytes), Some(labels)) = (disk, body.labels.as_mut()) {
                labels.extend(super::disk::DiskWatch::labels(bytes, by_engine));
            }
        };
        label(&mut body, by_engine.is_some());
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = match self
            .docker
            .create_container(Some(options.clone()), body.clone())
            .await
        {
            // This storage driver cannot bound a writable layer (overlay2 on ext4): said once,
            // and the watch bounds containers' disks from now on.
            Err(e) if by_engine.is_some() && e.to_string().contains("storage-opt") => {
                self.disk.engine_refused(&e);
                if let Some(hc) = body.host_config.as_mut() {
                    hc.storage_opt = None;
                }
                if let Some(labels) = body.labels.as_mut() {
                    labels.remove(super::disk::LABEL_DISK_ENGINE);
                }
                label(&mut body, false);
                self.docker
                    .create_container(Some(options.clone()), body.clone())
                    .await
            }
            other => other,
        };
        let created = match created {
            // No command, and the image has none of its own (a root file system imported,
            // say): the interactive keeper, as the process executor runs, so that the
            // instance stays up for its owner to enter.
            Err(e) if a.command.is_empty() && e.to_string().contains("No command specified") => {
                tracing::info!(reservation_id = %id, %image, "the image has no command: the interactive keeper runs");
                body.cmd = Some(crate::executor::interactive_keeper(id));
                body.open_stdin = None;
                self.docker.create_container(Some(options), body).await
            }
            other => other,
        };
        match created {
            Err(e) if super::is_not_found(&e) => return Ok(false),
            other => {
                other.map_err(|e| docker_error("create", id, refusal("create", &image, &e)))?;
            }
        }
        self.docker
            .start_container(&name, None)
            .await
            .map_err(|e| docker_error("start", id, refusal("start", &image, &e)))?;
        tracing::info!(reservation_id = %id, container = %name, gpus = %visible, "container started");
        if disk.is_some() {
            self.ensure_disk_watch();
        }
        Ok(true)
    }
}

impl DockerExecutor {
    /// The uid and gid an image runs as: its `USER` when numeric (`1000`, `1000:1000`), root
    /// when it has none; a user named in the image's own passwd is taken as root, with a
    /// warning (its files stay root's).
    async fn image_user(&self, image: &str) -> (u32, u32) {
        let user = match self.docker.inspect_image(image).await {
            Ok(inspect) => inspect.config.and_then(|c| c.user).unwrap_or_default(),
            Err(_) => String::new(),
        };
        let (u, g) = user.split_once(':').unwrap_or((user.as_str(), ""));
        match (u, u.parse::<u32>()) {
            ("" | "root", _) => (0, 0),
            (_, Ok(uid)) => (uid, g.parse().unwrap_or(uid)),
            (name, Err(_)) => {
                tracing::warn!(%image, user = %name, "the image runs as a named user; its volumes stay root's");
                (0, 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use bollard::Docker;
    use gpurent_types::agent::Assignment;

    use super::*;
    use crate::executor::{GpuLimits, ResourcesPerGpu};

    /// A MIG device is asked of the NVIDIA container toolkit by its own UUID (`MIG-...`), as
    /// a whole GPU is by its `GPU-...` UUID.
    #[tokio::test]
    async fn a_mig_unit_is_requested_by_its_uuid() {
        let mig = "MIG-7c2e6a2b-8f3d-5b1e-9a44-0d6f1c3e2b71";
        let assignment: Assignment = serde_json::from_value(serde_json::json!({
            "reservation_id": "r1", "epoch": 1, "gpus": [mig], "vram_mb": null,
            "image": "gpurent-test/busybox", "command": [], "env": {}, "run": true,
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        // The client connects lazily: no Engine is needed to build a request, only a socket
        // file where it would be (none answers on it).
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let socket = dir.path().join("docker.sock");
        let _listener =
            std::os::unix::net::UnixListener::bind(&socket).unwrap_or_else(|e| panic!("{e}"));
        let docker = Docker::connect_with_socket(
            &socket.to_string_lossy(),
            120,
            bollard::API_DEFAULT_VERSION,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let executor = DockerExecutor {
            docker,
            resources: ResourcesPerGpu::default(),
            gpu_devices: true,
            grace_s: 10,
            scope: None,
            entry_helper: PathBuf::from("gpurent"),
            gpu_limits: GpuLimits::default(),
            disk: Default::default(),
            pulls: Default::default(),
            pull_logs: Default::default(),
        };
        let requests = executor
            .host_config(&assignment)
            .device_requests
            .unwrap_or_default();
        let ids: Vec<Vec<String>> = requests
            .into_iter()
            .map(|r| r.device_ids.unwrap_or_default())
            .collect();
        assert_eq!(ids, vec![vec![mig.to_owned()]]);
    }
}
