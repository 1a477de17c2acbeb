//! What a sync reports beside the instances: where running instances' ports are published,
//! and the GPUs' and the CPU's telemetry.

use std::collections::BTreeMap;

use gpurent_types::agent::{
    Assignment, InstanceReport, InstanceState, NodeTelemetry, PublishedPort,
};

use super::Agent;

impl Agent {
    /// Running instances say where their ports are published.
    pub(super) async fn add_ports(
        &self,
        desired: &[Assignment],
        reports: &mut [InstanceReport],
        published: &mut BTreeMap<(String, i64), Vec<PublishedPort>>,
    ) {
        published.retain(|(id, epoch), _| {
            desired
                .iter()
                .any(|a| &a.reservation_id == id && a.epoch == *epoch)
        });
        for report in reports
            .iter_mut()
            .filter(|r| r.state == InstanceState::Running)
        {
            let Some(a) = desired
                .iter()
                .find(|a| a.reservation_id == report.reservation_id && !a.ports.is_empty())
            else {
                continue;
            };
            let key = (a.reservation_id.clone(), a.epoch);
            if !published.contains_key(&key) {
                let ports = self.executor.published_ports(a).await;
                if ports.len() == a.ports.len() {
                    published.insert(key.clone(), ports);
                }
            }
            report.ports = published.get(&key).cloned().unwrap_or_default();
        }
    }

    /// Running instances say what their disks hold, a minute apart (`measured`: when last).
    pub(super) async fn add_disks(
        &self,
        reports: &mut [InstanceReport],
        measured: &mut Option<tokio::time::Instant>,
    ) {
        if measured.is_some_and(|at| at.elapsed() < std::time::Duration::from_secs(60)) {
            return;
        }
        *measured = Some(tokio::time::Instant::now());
        for report in reports
            .iter_mut()
            .filter(|r| r.state == InstanceState::Running)
        {
            report.disk = self.executor.disk_usage(&report.reservation_id).await;
        }
    }

    /// The GPUs' telemetry, each compute process attributed to its reservation, and the CPU
    /// utilisation since the last heartbeat.
    pub(super) async fn telemetry(&self) -> Option<NodeTelemetry> {
        let cpu = self
            .cpu
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .sample();
        let mut telemetry = match self.gpus.sample() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot sample GPU telemetry");
                return None;
            }
        };
        for gpu in &mut telemetry.gpus {
            for p in &mut gpu.processes {
                p.reservation_id = self.executor.owner_of(p.pid).await;
            }
        }
        telemetry.cpu_utilization_pct = cpu;
        Some(telemetry)
    }
}
