//! A simulated executor for demos and tests: instances "run" in memory until stopped.
//! A command of `exit N` ends at once with code N, to exercise workloads that finish.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use gpurent_types::agent::Assignment;

use super::Executor;
use crate::reconcile::{Observed, ObservedState};
use crate::AgentError;

#[derive(Debug, Default)]
pub struct SimExecutor {
    instances: Mutex<BTreeMap<String, Observed>>,
}

impl SimExecutor {
    pub fn new() -> Self {
        SimExecutor::default()
    }
}

#[async_trait]
impl Executor for SimExecutor {
    fn name(&self) -> &'static str {
        "sim"
    }

    /// Simulated instances take volumes and leave them alone (the agent made them ready).
    async fn start_with(
        &self,
        a: &Assignment,
        volume: Option<&Path>,
        _binds: &[super::Bind],
    ) -> Result<(), AgentError> {
        self.start(a, volume).await
    }

    async fn start(&self, a: &Assignment, _volume: Option<&Path>) -> Result<(), AgentError> {
        let state = match a.command.as_slice() {
            [exit, code] if exit == "exit" => ObservedState::Exited(code.parse().unwrap_or(1)),
            _ => ObservedState::Running,
        };
        let mut instances = self.instances.lock().unwrap_or_else(|p| p.into_inner());
        instances.insert(
            a.reservation_id.clone(),
            Observed {
                reservation_id: a.reservation_id.clone(),
                epoch: a.epoch,
                state,
                pull: None,
            },
        );
        tracing::info!(reservation_id = %a.reservation_id, gpus = ?a.gpus, "sim instance started");
        Ok(())
    }

    /// Nothing runs, so nothing needs a grace period: the instance goes at once.
    async fn stop(&self, reservation_id: &str, _grace: Option<Duration>) -> Result<(), AgentError> {
        let mut instances = self.instances.lock().unwrap_or_else(|p| p.into_inner());
        if instances.remove(reservation_id).is_some() {
            tracing::info!(reservation_id, "sim instance stopped");
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<Observed>, AgentError> {
        let instances = self.instances.lock().unwrap_or_else(|p| p.into_inner());
        Ok(instances.values().cloned().collect())
    }
}
