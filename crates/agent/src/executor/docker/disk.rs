//! A container's own disk (its writable layer): bounded by the Engine with `--storage-opt size`
//! where its storage driver can; where it cannot (overlay2 on ext4), watched, and a container
//! that grows past its size is stopped and ends `failed` saying why. Either way measured, for
//! `gpurent get`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bollard::query_parameters::ListContainersOptionsBuilder;
use gpurent_types::agent::DiskUse;

use super::{DockerExecutor, LABEL_EPOCH, LABEL_RESERVATION, LABEL_SCOPE};

/// A container's disk size in bytes, on every container made with one.
pub const LABEL_DISK: &str = "io.gpurent.disk";
/// Set when the Engine itself bounds that size (`--storage-opt size`); else the watch does.
pub const LABEL_DISK_ENGINE: &str = "io.gpurent.disk-engine";

/// How often the watch measures containers' writable layers (`docker ps --size`, which walks
/// each one's files): a container can write this long past its size before it is stopped.
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// Bytes in decimal gigabytes, for people.
fn gb(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// The disk bound of one executor's containers, and what the watch measured.
#[derive(Debug, Clone, Default)]
pub(super) struct DiskWatch {
    /// Bytes of disk per GPU (`--disk-per-gpu-gb`); none: containers' disks are unbounded.
    per_gpu: Option<u64>,
    /// False once the Engine refused `--storage-opt size`: not asked again.
    engine_cannot: Arc<AtomicBool>,
    started: Arc<AtomicBool>,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    /// Each measured container's use, by reservation id.
    used: HashMap<String, DiskUse>,
    /// Instances the watch stopped, by reservation id: their epoch and why.
    overgrown: HashMap<String, (i64, String)>,
}

impl DiskWatch {
    pub(super) fn new(per_gpu: Option<u64>) -> Self {
        DiskWatch {
            per_gpu,
            ..DiskWatch::default()
        }
    }

    /// The disk of a container of `gpus` GPUs (a share counts as one), if bounded.
    pub(super) fn size_for(&self, gpus: usize) -> Option<u64> {
        self.per_gpu
            .map(|per_gpu| per_gpu.saturating_mul(gpus.max(1) as u64))
    }

    /// Whether to ask the Engine to bound it (until it once refused).
    pub(super) fn engine_may(&self) -> bool {
        !self.engine_cannot.load(Ordering::Relaxed)
    }

    /// The Engine refused `--storage-opt size`: said once; the watch bounds disks from now on.
    pub(super) fn engine_refused(&self, e: &impl std::fmt::Display) {
        if !self.engine_cannot.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, every_s = WATCH_EVERY.as_secs(), "the Docker Engine cannot bound a container's disk (--storage-opt size needs overlay2 on XFS with pquota, btrfs or zfs): the agent measures containers' writable layers instead and stops one that grows past its disk");
        }
    }

    /// The labels that say a container's disk and who bounds it.
    pub(super) fn labels(size: u64, by_engine: bool) -> Vec<(String, String)> {
        let mut labels = vec![(LABEL_DISK.to_owned(), size.to_string())];
        if by_engine {
            labels.push((LABEL_DISK_ENGINE.to_owned(), "1".to_owned()));
        }
        labels
    }

    /// What the last round measured of this reservation's container.
    pub(super) fn usage(&self, reservation_id: &str) -> Option<DiskUse> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.used.get(reservation_id).copied()
    }

    /// The instances the watch stopped: each one's id, epoch and why.
    pub(super) fn overgrown(&self) -> Vec<(String, i64, String)> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .overgrown
            .iter()
            .map(|(id, (epoch, why))| (id.clone(), *epoch, why.clone()))
            .collect()
    }

    /// Its stop was reported and its output read: nothing of it kept.
    pub(super) fn forget(&self, reservation_id: &str, epoch: i64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state
            .overgrown
            .get(reservation_id)
            .is_some_and(|(e, _)| *e == epoch)
        {
            state.overgrown.remove(reservation_id);
        }
    }

    fn note(&self, used: HashMap<String, DiskUse>, over: &[(String, i64, String)]) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.used = used;
        for (id, epoch, why) in over {
            state.overgrown.insert(id.clone(), (*epoch, why.clone()));
        }
    }
}

impl DockerExecutor {
    /// Starts the disk watch once, when a container with a disk size exists (made now, or
    /// found after a restart).
    pub(super) fn ensure_disk_watch(&self) {
        if self.disk.per_gpu.is_none() || self.disk.started.swap(true, Ordering::Relaxed) {
            return;
        }
        let executor = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(WATCH_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if let Err(e) = executor.measure_disks().await {
                    tracing::warn!(error = %e, "could not measure containers' disks");
                }
            }
        });
    }

    /// One round: each running container's writable layer measured; one past its size that
    /// the Engine does not bound is stopped (its output kept, as any stopped instance's),
    /// and remembered as failed, saying why.
    async fn measure_disks(&self) -> Result<(), bollard::errors::Error> {
        let filters = HashMap::from([("label", vec![LABEL_DISK.to_owned()])]);
        let options = ListContainersOptionsBuilder::default()
            .size(true)
            .filters(&filters)
            .build();
        let mut used = HashMap::new();
        let mut over = Vec::new();
        for c in self.docker.list_containers(Some(options)).await? {
            let labels = c.labels.unwrap_or_default();
            let scope = self.scope.as_deref();
            if scope.is_some_and(|s| labels.get(LABEL_SCOPE).is_some_and(|l| l != s)) {
                continue;
            }
            let (Some(id), Some(epoch), Some(size)) = (
                labels.get(LABEL_RESERVATION),
                labels.get(LABEL_EPOCH).and_then(|e| e.parse::<i64>().ok()),
                labels.get(LABEL_DISK).and_then(|s| s.parse::<u64>().ok()),
            ) else {
                continue;
            };
            // The Engine leaves out a size of nothing written.
            let written = c.size_rw.and_then(|s| u64::try_from(s).ok()).unwrap_or(0);
            used.insert(
                id.clone(),
                DiskUse {
                    used_bytes: written,
                    size_bytes: size,
                },
            );
            if written > size && !labels.contains_key(LABEL_DISK_ENGINE) {
                let why = format!(
                    "stopped: it wrote {} to its own disk, past its size of {} (this node's Docker storage driver cannot bound a container's disk, so the agent stopped it; write large data to a volume)",
                    gb(written),
                    gb(size)
                );
                over.push((id.clone(), epoch, why));
            }
        }
        self.disk.note(used, &over);
        for (id, _, _) in over {
            tracing::warn!(reservation_id = %id, "a container grew past its disk: stopped");
            if let Err(e) = self.stop_container(&id, Some(Duration::ZERO)).await {
                tracing::warn!(reservation_id = %id, error = %e, "could not stop an overgrown container");
            }
        }
        Ok(())
    }
}
