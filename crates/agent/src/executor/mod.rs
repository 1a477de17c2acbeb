//! Executors run a reservation's workload on the node: `process` (a sandboxed process tree in
//! a cgroup), `docker` (a container through the Docker Engine), `docker+process` (by whether
//! the reservation has an image), `sim` (in memory, for demos and tests).

mod by_image;
mod cgroup;
pub mod docker;
mod limits;
mod process;
/// A process's real uid (`/proc`), for the entry sessions that check whose process they join.
pub(crate) use process::process_uid;
pub mod resources;
mod sandbox;
mod sim;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use gpurent_types::agent::{Assignment, PublishedPort};

pub use by_image::ByImageExecutor;
pub use cgroup::{CgroupLimits, CgroupRoot};
pub use docker::DockerExecutor;
pub use limits::GpuLimits;
pub use process::{Isolation, ProcessExecutor, Scratch, DEFAULT_INSTANCE_UID_BASE};
pub use resources::{HostCapacity, InstanceLimits, ResourcesPerGpu};
pub use sandbox::UID_RANGE as INSTANCE_UID_RANGE;
pub use sandbox::{running_as_root, system_tool};
pub use sim::SimExecutor;

use crate::entry::{Entered, EntryError, EntryRequest};
use crate::reconcile::Observed;
use crate::AgentError;

/// Variables every executor sets for an instance (its GPUs, its identity), which a tenant's
/// environment never overrides: `CUDA_VISIBLE_DEVICES`, `NVIDIA_*`, `GPURENT_*`, `CUDA_MPS_*`
/// (an MPS client's limits).
pub fn is_reserved_env(name: &str) -> bool {
    name == "CUDA_VISIBLE_DEVICES"
        || name.starts_with("NVIDIA_")
        || name.starts_with("GPURENT_")
        || name.starts_with("CUDA_MPS_")
}

/// A directory of the node bound into an instance (a tenant's volume, made ready by the
/// agent): at `target` inside it, read-only or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: std::path::PathBuf,
    pub target: String,
    pub read_only: bool,
}

#[async_trait]
pub trait Executor: Send + Sync + std::fmt::Debug {
    /// Reported to the control plane and shown in `gpurent nodes ls`.
    fn name(&self) -> &'static str;

    /// Whether an instance is kept from the node's secrets and from other instances (false:
    /// the process executor on a host whose owner allowed unisolated instances). Reported to
    /// the control plane: `gpurent nodes ls` and the offers say `unisolated`.
    fn isolated(&self) -> bool {
        true
    }

    /// Whether instances share the node's network (the process executor where no network
    /// namespace with pasta can be made, or unisolated): reported to the control plane, and
    /// `gpurent nodes ls` and the offers say `network: shared`.
    fn shared_network(&self) -> bool {
        false
    }

    /// Whether instances may run as containers (then GPUs reach them through the NVIDIA
    /// container runtime, whose toolkit the agent checks).
    fn runs_containers(&self) -> bool {
        false
    }

    /// Starts the workload of an assignment, with its checkpoint volume (a directory of the
    /// node) when it has one.
    async fn start(&self, assignment: &Assignment, volume: Option<&Path>)
        -> Result<(), AgentError>;

    /// Starts it with the tenant's volumes bound in too. An executor that cannot bind them
    /// refuses an assignment that has any.
    async fn start_with(
        &self,
        assignment: &Assignment,
        volume: Option<&Path>,
        binds: &[Bind],
    ) -> Result<(), AgentError> {
        if !binds.is_empty() {
            return Err(AgentError::Executor {
                executor: self.name(),
                action: "start",
                reservation_id: assignment.reservation_id.clone(),
                message: "this executor cannot mount volumes".to_owned(),
            });
        }
        self.start(assignment, volume).await
    }

    /// Stops and removes a reservation's workload: SIGTERM, then SIGKILL once `grace` is over
    /// (None: the executor's default). Stopping what is gone is not an error. Its output is
    /// kept (`read_output`, `output_size`, `kept_outputs`) until `forget_output`: what it
    /// wrote since the last sync and in its grace period is shipped before the stop is
    /// reported.
    async fn stop(&self, reservation_id: &str, grace: Option<Duration>) -> Result<(), AgentError>;

    /// The instances stopped whose output is kept, as (reservation, epoch); also those a
    /// stop kept before the agent restarted.
    async fn kept_outputs(&self) -> Result<Vec<(String, i64)>, AgentError> {
        Ok(Vec::new())
    }

    /// Lets go of the output a stop kept of the reservation's instance of this epoch (shipped,
    /// or nobody wants it). Forgetting what is not kept is not an error.
    async fn forget_output(&self, reservation_id: &str, epoch: i64) -> Result<(), AgentError> {
        let _ = (reservation_id, epoch);
        Ok(())
    }

    /// Every instance this executor runs for gpurent on this node, including ones started
    /// before the agent restarted.
    async fn list(&self) -> Result<Vec<Observed>, AgentError>;

    /// Up to `max` bytes of the instance's output (stdout and stderr) from byte `offset` on;
    /// empty when there is nothing new, None when the executor keeps no output. A stopped
    /// instance's kept output once it is gone.
    async fn read_output(
        &self,
        reservation_id: &str,
        offset: u64,
        max: usize,
    ) -> Result<Option<Vec<u8>>, AgentError> {
        let _ = (reservation_id, offset, max);
        Ok(None)
    }

    /// How many bytes of output the instance has written so far; None when the executor
    /// keeps no output or cannot say. (Past the control plane's cap only the end of an
    /// ended instance's output is shipped: it is read from here less the tail.)
    async fn output_size(&self, reservation_id: &str) -> Result<Option<u64>, AgentError> {
        let _ = reservation_id;
        Ok(None)
    }

    /// Where the instance's ports are reachable on the node. Processes share the node's
    /// network, so by default a port is published as itself.
    async fn published_ports(&self, assignment: &Assignment) -> Vec<PublishedPort> {
        assignment
            .ports
            .iter()
            .map(|&p| PublishedPort {
                container_port: p,
                host_port: p,
            })
            .collect()
    }

    /// What the instance's own disk holds and its size, where the executor bounds it.
    async fn disk_usage(&self, reservation_id: &str) -> Option<gpurent_types::agent::DiskUse> {
        let _ = reservation_id;
        None
    }

    /// Resolves when an instance changed on its own between the agent's looks (an image's
    /// pull ended and its container started, or it failed): the agent then reports at once
    /// rather than after its long poll. Never, for executors that start instances at once.
    async fn changed(&self) {
        std::future::pending::<()>().await;
    }

    /// The images this node has (`name:tag`), for placement's image-locality bonus; none
    /// for executors that run no images.
    async fn images(&self) -> Vec<String> {
        Vec::new()
    }

    /// Pulls these images in the background where they are missing, to keep them warm
    /// (`gpurent agent --prepull`); executors that run no images say so and do nothing.
    async fn prepull(&self, images: &[String]) {
        if !images.is_empty() {
            tracing::warn!(
                executor = self.name(),
                ?images,
                "this executor runs no images: --prepull does nothing"
            );
        }
    }

    /// The reservation whose instance runs the process `pid`, if any (for telemetry).
    async fn owner_of(&self, pid: u32) -> Option<String> {
        let _ = pid;
        None
    }

    /// Starts a session in the reservation's running instance (a shell, a command, an SFTP
    /// server, a TCP connection): in its namespaces and cgroup, as its user, with its
    /// environment. By default there is nothing to enter (the sim executor).
    async fn enter(
        &self,
        reservation_id: &str,
        request: EntryRequest,
    ) -> Result<Entered, EntryError> {
        let _ = (reservation_id, request);
        Err(EntryError::NothingToEnter)
    }
}

/// What an instance without a command runs where there is nothing else to run (no image, or
/// an image with no command of its own): a line in its log saying how to use it, then nothing
/// until it is stopped (its hours' end, or its owner).
pub(crate) fn interactive_keeper(id: &str) -> Vec<String> {
    vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!(
            "echo 'gpurent: an interactive instance (no command): it stays up until it is \
             stopped or its hours end; enter it with: gpurent ssh {id}'; exec sleep infinity"
        ),
    ]
}
