//! Stops in flight: each runs in a task of its own, so that a workload's grace period never
//! holds up the agent's sync loop (and its heartbeats); one stop at a time per reservation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{Id, JoinSet};

use crate::{AgentError, CheckpointConfig, Executor};

#[derive(Debug)]
pub(crate) struct Stops {
    executor: Arc<dyn Executor>,
    /// Saved through the owner's hook once an instance with a volume has stopped.
    checkpoints: Option<Arc<CheckpointConfig>>,
    tasks: JoinSet<Result<(), AgentError>>,
    /// The reservation each task stops.
    in_flight: BTreeMap<Id, String>,
}

impl Stops {
    pub(crate) fn new(
        executor: Arc<dyn Executor>,
        checkpoints: Option<Arc<CheckpointConfig>>,
    ) -> Self {
        Stops {
            executor,
            checkpoints,
            tasks: JoinSet::new(),
            in_flight: BTreeMap::new(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    pub(crate) fn contains(&self, reservation_id: &str) -> bool {
        self.in_flight.values().any(|id| id == reservation_id)
    }

    /// Starts stopping the reservation's instance, unless a stop of it is in flight already;
    /// false then.
    pub(crate) fn start(&mut self, reservation_id: &str, grace: Option<Duration>) -> bool {
        if self.contains(reservation_id) {
            return false;
        }
        let executor = Arc::clone(&self.executor);
        let checkpoints = self.checkpoints.clone();
        let id = reservation_id.to_owned();
        let handle = self.tasks.spawn(async move {
            executor.stop(&id, grace).await?;
            if let Some(checkpoints) = checkpoints {
                checkpoints.save(&id).await;
            }
            Ok(())
        });
        tracing::info!(reservation_id, ?grace, "stopping instance");
        self.in_flight
            .insert(handle.id(), reservation_id.to_owned());
        true
    }

    /// Waits for the next stop to end; true when it worked. Pending forever when none is in
    /// flight.
    pub(crate) async fn finished(&mut self) -> bool {
        match self.tasks.join_next_with_id().await {
            Some(outcome) => self.record(outcome),
            None => std::future::pending().await,
        }
    }

    /// Takes note of the stops that have ended.
    pub(crate) fn reap(&mut self) {
        while let Some(outcome) = self.tasks.try_join_next_with_id() {
            self.record(outcome);
        }
    }

    /// Waits for every stop in flight (an agent that shuts down finishes what it began).
    pub(crate) async fn wait_all(&mut self) {
        if !self.is_empty() {
            tracing::info!(
                stops = self.in_flight.len(),
                "waiting for the stops in flight"
            );
        }
        while let Some(outcome) = self.tasks.join_next_with_id().await {
            self.record(outcome);
        }
    }

    /// A failed stop is forgotten here; the next plan asks for it again.
    fn record(
        &mut self,
        outcome: Result<(Id, Result<(), AgentError>), tokio::task::JoinError>,
    ) -> bool {
        let (task, result) = match outcome {
            Ok((task, result)) => (task, result.map_err(|e| e.to_string())),
            Err(e) => (e.id(), Err(format!("the stop task failed: {e}"))),
        };
        let reservation_id = self.in_flight.remove(&task).unwrap_or_default();
        match result {
            Ok(()) => {
                tracing::info!(%reservation_id, "instance stopped");
                true
            }
            Err(error) => {
                tracing::warn!(%reservation_id, %error, "stop failed; retrying next heartbeat");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use gpurent_types::agent::Assignment;

    use super::*;
    use crate::executor::{ProcessExecutor, ResourcesPerGpu};

    fn stubborn(id: &str) -> Assignment {
        Assignment {
            reservation_id: id.to_owned(),
            epoch: 1,
            restart_count: 0,
            array_index: None,
            gpus: vec![],
            vram_mb: None,
            image: None,
            command: vec![
                "/bin/sh".into(),
                "-c".into(),
                "trap '' TERM; touch ready; while true; do sleep 0.1; done".into(),
            ],
            env: Default::default(),
            run: true,
            ports: vec![],
            log_offset: 0,
            stop_grace_s: None,
            checkpoint: false,
            secrets: Default::default(),
            sealed_secrets: None,
            mounts: Vec::new(),
        }
    }

    /// A stop that takes its grace period runs beside the caller, is not started twice, and
    /// its end is noticed.
    #[tokio::test]
    async fn one_stop_at_a_time_per_reservation() {
        let dir = tempfile::tempdir().unwrap();
        let executor = Arc::new(
            ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default()).unwrap(),
        );
        executor.start(&stubborn("r1"), None).await.unwrap();
        let ready = dir.path().join("instances/r1/ready");
        for _ in 0..200 {
            if ready.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut stops = Stops::new(executor.clone(), None);
        assert!(stops.start("r1", Some(Duration::from_secs(1))));
        assert!(stops.contains("r1") && !stops.contains("r2"));
        // The caller goes on meanwhile, and the same instance is not stopped again.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stops.reap();
        assert!(
            stops.contains("r1"),
            "the stop ended within its grace period"
        );
        assert!(!stops.start("r1", None));
        assert!(stops.finished().await);
        assert!(stops.is_empty());
        assert!(executor.list().await.unwrap().is_empty());
        // Once it is done, a new stop may begin (of what is gone: a no-op that works).
        assert!(stops.start("r1", None));
        stops.wait_all().await;
        assert!(stops.is_empty());
    }
}
