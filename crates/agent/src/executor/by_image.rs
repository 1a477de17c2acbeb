//! The executor `auto` picks where a Docker Engine answers and processes can be isolated too:
//! reservations with an image run as containers, those without one as processes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gpurent_types::agent::{Assignment, PublishedPort};

use super::Executor;
use crate::entry::{Entered, EntryError, EntryRequest};
use crate::reconcile::Observed;
use crate::AgentError;

/// Two executors side by side, each instance in the one its assignment's image calls for. A
/// reservation's image never changes, so each reservation only ever has an instance in one of
/// them; what is asked of a reservation goes to the one that has it.
#[derive(Debug)]
pub struct ByImageExecutor {
    containers: Arc<dyn Executor>,
    processes: Arc<dyn Executor>,
}

impl ByImageExecutor {
    /// `containers` runs assignments with an image (the Docker executor), `processes` those
    /// without (the process executor).
    pub fn new(containers: Arc<dyn Executor>, processes: Arc<dyn Executor>) -> Self {
        Self {
            containers,
            processes,
        }
    }

    fn for_assignment(&self, a: &Assignment) -> &dyn Executor {
        if a.image.is_some() {
            self.containers.as_ref()
        } else {
            self.processes.as_ref()
        }
    }
}

#[async_trait]
impl Executor for ByImageExecutor {
    fn name(&self) -> &'static str {
        "docker+process"
    }

    fn isolated(&self) -> bool {
        self.containers.isolated() && self.processes.isolated()
    }

    fn shared_network(&self) -> bool {
        self.processes.shared_network()
    }

    fn runs_containers(&self) -> bool {
        self.containers.runs_containers()
    }

    async fn start(&self, a: &Assignment, volume: Option<&Path>) -> Result<(), AgentError> {
        self.for_assignment(a).start(a, volume).await
    }

    async fn disk_usage(&self, id: &str) -> Option<gpurent_types::agent::DiskUse> {
        match self.processes.disk_usage(id).await {
            Some(d) => Some(d),
            None => self.containers.disk_usage(id).await,
        }
    }

    async fn start_with(
        &self,
        a: &Assignment,
        volume: Option<&Path>,
        binds: &[super::Bind],
    ) -> Result<(), AgentError> {
        self.for_assignment(a).start_with(a, volume, binds).await
    }

    /// Both: stopping what one of them does not run is not an error in either.
    async fn stop(&self, reservation_id: &str, grace: Option<Duration>) -> Result<(), AgentError> {
        let (processes, containers) = tokio::join!(
            self.processes.stop(reservation_id, grace),
            self.containers.stop(reservation_id, grace)
        );
        processes.and(containers)
    }

    async fn kept_outputs(&self) -> Result<Vec<(String, i64)>, AgentError> {
        let mut kept = self.processes.kept_outputs().await?;
        kept.extend(self.containers.kept_outputs().await?);
        Ok(kept)
    }

    async fn forget_output(&self, reservation_id: &str, epoch: i64) -> Result<(), AgentError> {
        self.processes
            .forget_output(reservation_id, epoch)
            .await
            .and(self.containers.forget_output(reservation_id, epoch).await)
    }

    async fn list(&self) -> Result<Vec<Observed>, AgentError> {
        let mut observed = self.processes.list().await?;
        observed.extend(self.containers.list().await?);
        Ok(observed)
    }

    /// The process executor first: it answers None from its files at once where it has no
    /// such instance, and the Engine is asked only then.
    async fn read_output(
        &self,
        reservation_id: &str,
        offset: u64,
        max: usize,
    ) -> Result<Option<Vec<u8>>, AgentError> {
        match self
            .processes
            .read_output(reservation_id, offset, max)
            .await?
        {
            Some(output) => Ok(Some(output)),
            None => {
                self.containers
                    .read_output(reservation_id, offset, max)
                    .await
            }
        }
    }

    async fn output_size(&self, reservation_id: &str) -> Result<Option<u64>, AgentError> {
        match self.processes.output_size(reservation_id).await? {
            Some(size) => Ok(Some(size)),
            None => self.containers.output_size(reservation_id).await,
        }
    }

    async fn published_ports(&self, assignment: &Assignment) -> Vec<PublishedPort> {
        self.for_assignment(assignment)
            .published_ports(assignment)
            .await
    }

    async fn images(&self) -> Vec<String> {
        self.containers.images().await
    }

    async fn prepull(&self, images: &[String]) {
        self.containers.prepull(images).await;
    }

    async fn owner_of(&self, pid: u32) -> Option<String> {
        match self.processes.owner_of(pid).await {
            Some(owner) => Some(owner),
            None => self.containers.owner_of(pid).await,
        }
    }

    /// The process executor says `NotRunning` of an instance it does not run: then it is a
    /// container, or nothing (and the Docker executor says so).
    async fn enter(
        &self,
        reservation_id: &str,
        request: EntryRequest,
    ) -> Result<Entered, EntryError> {
        match self.processes.enter(reservation_id, request.clone()).await {
            Err(EntryError::NotRunning { .. }) => {
                self.containers.enter(reservation_id, request).await
            }
            entered => entered,
        }
    }
}
