//! A sandboxed instance's own directory with a size: its scratch, a file system of the
//! instance's disk size (a loop-mounted ext4 image, or a project quota where the node's file
//! system has them, kept beside the tenants' volumes by the same store) bound as its `HOME`,
//! so that a write past it fails with ENOSPC inside the instance while the node's disk, its
//! agent and the other instances go on.

use std::path::PathBuf;

use crate::volumes::{Enforcement, VolumeStore, VolumeUsage};

/// Where instances' scratch lives and how big it is.
#[derive(Debug, Clone)]
pub struct Scratch {
    store: VolumeStore,
    /// Bytes per GPU (a share counts as one).
    per_gpu: u64,
}

impl Scratch {
    /// Scratch of `per_gpu` bytes per GPU in the node's volume store; Err says why sizes
    /// cannot be enforced here.
    pub fn new(store: VolumeStore, per_gpu: u64) -> Result<Self, String> {
        if let Enforcement::Unavailable(why) = store.enforcement() {
            return Err(why.clone());
        }
        Ok(Scratch { store, per_gpu })
    }

    fn id(reservation_id: &str) -> String {
        format!("scratch-{reservation_id}")
    }

    /// The instance's scratch size.
    pub fn bytes_for(&self, gpus: usize) -> u64 {
        self.per_gpu
            .saturating_mul(u64::try_from(gpus.max(1)).unwrap_or(u64::MAX))
    }

    /// The instance's scratch, made and mounted (again after a reboot); its directory.
    pub(super) async fn mount(&self, reservation_id: &str, gpus: usize) -> Result<PathBuf, String> {
        let bytes = self.bytes_for(gpus);
        self.store
            .ensure_local(&Self::id(reservation_id), bytes)
            .await
            .map_err(|e| format!("its disk of {bytes} bytes: {e}"))
    }

    /// Unmounts and deletes a stopped instance's scratch; none is fine.
    pub(super) async fn remove(&self, reservation_id: &str) -> Result<(), String> {
        self.store
            .remove_local(&Self::id(reservation_id))
            .await
            .map_err(|e| format!("its disk: {e}"))
    }

    /// What its scratch holds and its size, where it has one.
    pub(super) fn usage(&self, reservation_id: &str) -> Option<VolumeUsage> {
        self.store.usage_local(&Self::id(reservation_id)).ok()
    }
}
