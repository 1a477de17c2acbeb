//! The node's volumes as the control plane wants them: made, grown and removed when its
//! answers say so, measured now and then, and bound into the instances that mount them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use gpurent_types::agent::{Assignment, NodeVolume, VolumeFacts, VolumeReport};
use gpurent_types::api::VolumeKind;
use tokio::time::Instant;

use crate::executor::Bind;
use crate::volumes::{Enforcement, VolumeStore};
use crate::AgentError;

/// How often the local volumes' use is measured and reported.
const MEASURE_EVERY: Duration = Duration::from_secs(60);

/// What the agent does with volumes (none without a volume store).
#[derive(Debug, Default)]
pub(crate) struct Keeper {
    store: Option<VolumeStore>,
    /// The volumes of the control plane's last answer that named any, by id: what was done
    /// for each, so that an unchanged one is left alone.
    known: Mutex<BTreeMap<String, NodeVolume>>,
    /// Reports the control plane has not taken yet.
    pending: Mutex<Vec<VolumeReport>>,
    measured: Mutex<Option<Instant>>,
}

impl Keeper {
    pub fn new(store: Option<VolumeStore>) -> Self {
        Keeper {
            store,
            ..Keeper::default()
        }
    }

    /// What the node offers, for its host facts.
    pub fn facts(&self) -> Option<VolumeFacts> {
        let store = self.store.as_ref()?;
        let (enforcement, reason) = match store.enforcement() {
            Enforcement::Unavailable(why) => ("unavailable".to_owned(), Some(why.clone())),
            e => (e.as_str().to_owned(), None),
        };
        Some(VolumeFacts {
            enforcement,
            reason,
            free_bytes: store.free_bytes().unwrap_or(0),
            shared: store.has_shared(),
        })
    }

    /// Makes, grows and removes what the control plane's answer asks that was not done yet.
    pub async fn apply(&self, wanted: &[NodeVolume]) {
        let Some(store) = &self.store else {
            return;
        };
        for v in wanted {
            let done = self.lock_known().get(&v.volume_id) == Some(v);
            if done {
                continue;
            }
            let report = match (v.kind, v.remove) {
                (VolumeKind::Local, true) => {
                    removed(&v.volume_id, store.remove_local(&v.volume_id).await)
                }
                (VolumeKind::Shared, true) => {
                    removed(&v.volume_id, store.remove_shared(&v.volume_id).await)
                }
                (VolumeKind::Local, false) => self.make_local(store, v).await,
                // A shared volume is made by the first instance that mounts it.
                (VolumeKind::Shared, false) => continue,
            };
            match &report.error {
                Some(e) => tracing::warn!(volume_id = %v.volume_id, error = %e, "volume"),
                None => {
                    tracing::info!(volume_id = %v.volume_id, remove = v.remove, size_bytes = v.size_bytes, "volume kept as asked");
                    self.lock_known().insert(v.volume_id.clone(), v.clone());
                }
            }
            self.lock_pending().push(report);
        }
    }

    async fn make_local(&self, store: &VolumeStore, v: &NodeVolume) -> VolumeReport {
        let id = &v.volume_id;
        let present = store.local_ids().is_ok_and(|ids| ids.contains(id));
        let made = if v.made && !present {
            Err("its data is missing on this node (its volumes dir was emptied?); it is not made again empty".to_owned())
        } else {
            store
                .ensure_local(id, v.size_bytes)
                .await
                .map_err(|e| e.to_string())
        };
        match made.and_then(|_| store.usage_local(id).map_err(|e| e.to_string())) {
            Ok(usage) => VolumeReport {
                volume_id: id.clone(),
                // Made at the size asked (its file system shows less: its own structures).
                size_bytes: Some(v.size_bytes),
                used_bytes: Some(usage.used_bytes),
                removed: false,
                error: None,
            },
            Err(error) => failed(id, error),
        }
    }

    /// The reports to send with this sync, and the volumes' free bytes when it is time to
    /// measure again (every local volume's use then goes too).
    pub fn take_reports(&self) -> (Vec<VolumeReport>, Option<u64>) {
        let Some(store) = &self.store else {
            return (Vec::new(), None);
        };
        let mut reports = std::mem::take(&mut *self.lock_pending());
        let due = {
            let mut measured = self.measured.lock().unwrap_or_else(|p| p.into_inner());
            let due = measured.is_none_or(|at| at.elapsed() >= MEASURE_EVERY);
            if due {
                *measured = Some(Instant::now());
            }
            due
        };
        if !due {
            return (reports, None);
        }
        let known: Vec<(String, u64)> = self
            .lock_known()
            .values()
            .filter(|v| v.kind == VolumeKind::Local && !v.remove)
            .map(|v| (v.volume_id.clone(), v.size_bytes))
            .collect();
        for (id, size) in known {
            if reports.iter().any(|r| r.volume_id == id) {
                continue;
            }
            if let Ok(usage) = store.usage_local(&id) {
                reports.push(VolumeReport {
                    volume_id: id,
                    size_bytes: Some(size),
                    used_bytes: Some(usage.used_bytes),
                    removed: false,
                    error: None,
                });
            }
        }
        (reports, store.free_bytes().ok())
    }

    /// Removes the disks of instances that are gone (a reboot, an instance killed while its
    /// agent was down): none of `live` reservations'.
    pub async fn prune_disks(&self, live: &[&str]) {
        let Some(store) = &self.store else {
            return;
        };
        let Ok(ids) = store.local_ids() else {
            return;
        };
        for id in ids {
            let Some(reservation) = id.strip_prefix("scratch-") else {
                continue;
            };
            if live.contains(&reservation) {
                continue;
            }
            match store.remove_local(&id).await {
                Ok(()) => {
                    tracing::info!(reservation_id = %reservation, "removed the disk of an instance that is gone")
                }
                Err(e) => {
                    tracing::warn!(reservation_id = %reservation, error = %e, "cannot remove the disk of an instance that is gone")
                }
            }
        }
    }

    /// Reports a sync that failed did not deliver: sent with the next one.
    pub fn put_back(&self, reports: Vec<VolumeReport>) {
        let mut pending = self.lock_pending();
        let newer = std::mem::take(&mut *pending);
        *pending = reports;
        pending.extend(newer);
    }

    /// Where a volume's files are on this node, to serve them with no instance (`gpurent
    /// volumes cp`): a local volume made here (mounted again if it is not), or a shared one on
    /// the shared storage (made if new). Never an instance's own disk.
    pub async fn dir_of(&self, volume_id: &str, shared: bool) -> Result<PathBuf, String> {
        let Some(store) = &self.store else {
            return Err("this node keeps no volumes".to_owned());
        };
        if volume_id.starts_with("scratch-") {
            return Err(format!("{volume_id:?} is not a volume"));
        }
        if shared {
            if !store.has_shared() {
                return Err("this node does not mount the shared volume storage".to_owned());
            }
            return store
                .ensure_shared(volume_id)
                .await
                .map_err(|e| e.to_string());
        }
        let size = self
            .lock_known()
            .get(volume_id)
            .filter(|v| v.kind == VolumeKind::Local && !v.remove)
            .map(|v| v.size_bytes);
        let Some(size) = size else {
            return Err(format!(
                "volume {volume_id} is not on this node (yet); try again in a moment"
            ));
        };
        if !store
            .local_ids()
            .is_ok_and(|ids| ids.iter().any(|i| i == volume_id))
        {
            return Err(format!(
                "the data of volume {volume_id} is missing on this node"
            ));
        }
        store
            .ensure_local(volume_id, size)
            .await
            .map_err(|e| e.to_string())
    }

    /// The assignment's volumes, ready on this node, as binds for its executor.
    pub async fn binds(&self, a: &Assignment) -> Result<Vec<Bind>, AgentError> {
        if a.mounts.is_empty() {
            return Ok(Vec::new());
        }
        let refused = |volume_id: &str, message: String| AgentError::Volume {
            volume_id: volume_id.to_owned(),
            message,
        };
        let Some(store) = &self.store else {
            return Err(refused(
                &a.mounts[0].volume_id,
                "this node keeps no volumes".to_owned(),
            ));
        };
        let mut binds = Vec::with_capacity(a.mounts.len());
        for m in &a.mounts {
            let source = match m.kind {
                VolumeKind::Local => {
                    // Its size now (grown since the reservation was made, perhaps).
                    let (made, size) = match self.lock_known().get(&m.volume_id) {
                        Some(v) => (v.made, v.size_bytes.max(m.size_bytes)),
                        None => (false, m.size_bytes),
                    };
                    let present = store
                        .local_ids()
                        .is_ok_and(|ids| ids.contains(&m.volume_id));
                    if made && !present {
                        return Err(refused(
                            &m.volume_id,
                            "its data is missing on this node".to_owned(),
                        ));
                    }
                    store.ensure_local(&m.volume_id, size).await
                }
                VolumeKind::Shared => store.ensure_shared(&m.volume_id).await,
            }
            .map_err(|e| refused(&m.volume_id, e.to_string()))?;
            binds.push(Bind {
                source,
                target: m.path.clone(),
                read_only: m.read_only,
            });
        }
        Ok(binds)
    }

    fn lock_known(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, NodeVolume>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Vec<VolumeReport>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn failed(id: &str, error: String) -> VolumeReport {
    VolumeReport {
        volume_id: id.to_owned(),
        size_bytes: None,
        used_bytes: None,
        removed: false,
        error: Some(error),
    }
}

fn removed(id: &str, outcome: Result<(), crate::volumes::VolumeError>) -> VolumeReport {
    match outcome {
        Ok(()) => VolumeReport {
            volume_id: id.to_owned(),
            size_bytes: None,
            used_bytes: None,
            removed: true,
            error: None,
        },
        Err(e) => failed(id, e.to_string()),
    }
}
