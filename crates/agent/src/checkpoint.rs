//! Checkpoint volumes: a directory per reservation, kept across its instance's restarts and
//! epochs, that an owner's hook can restore before a start and save after a stop.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gpurent_types::agent::Assignment;
use tokio::process::Command;

use crate::AgentError;

/// The longest a hook may run before it is killed and counted as failed.
const HOOK_TIMEOUT: Duration = Duration::from_secs(10 * 60);

#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// One directory per reservation under it. Where every node mounts the same shared
    /// storage here, a run rescheduled onto another node finds what the last one saved.
    pub root: PathBuf,
    /// Run with `sh -c` before a start (`GPURENT_CHECKPOINT_ACTION=restore`) and after a
    /// stop (`save`), with `GPURENT_RESERVATION_ID`, `GPURENT_EPOCH` (restore only) and
    /// `GPURENT_CHECKPOINT_DIR` set: for owners who keep checkpoints in object storage.
    pub hook: Option<String>,
    /// Volumes untouched for this long are removed when the agent starts.
    pub keep: Duration,
}

impl CheckpointConfig {
    pub fn new(root: PathBuf) -> Self {
        CheckpointConfig {
            root,
            hook: None,
            keep: Duration::from_secs(7 * 24 * 3600),
        }
    }

    /// The reservation's volume (whether or not it exists).
    pub fn volume(&self, reservation_id: &str) -> PathBuf {
        self.root.join(reservation_id)
    }

    /// Creates the assignment's volume (owner-only) and restores it through the hook. A
    /// failing hook is logged and the instance starts with what the volume holds.
    pub async fn prepare(&self, a: &Assignment) -> Result<PathBuf, AgentError> {
        let dir = self.volume(&a.reservation_id);
        let error = |e: std::io::Error| AgentError::Checkpoint {
            reservation_id: a.reservation_id.clone(),
            message: format!("create {}: {e}", dir.display()),
        };
        std::fs::create_dir_all(&dir).map_err(error)?;
        set_owner_only(&self.root).map_err(error)?;
        set_owner_only(&dir).map_err(error)?;
        let epoch = a.epoch.to_string();
        self.run_hook("restore", &a.reservation_id, &dir, Some(&epoch))
            .await;
        Ok(dir)
    }

    /// Saves the volume through the hook after the reservation's instance stopped; nothing
    /// when it has no volume here.
    pub async fn save(&self, reservation_id: &str) {
        let dir = self.volume(reservation_id);
        if dir.is_dir() {
            self.run_hook("save", reservation_id, &dir, None).await;
        }
    }

    /// Removes volumes last modified before `keep` ago, except those of `live` reservations.
    pub fn prune(&self, live: &[&str]) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        let cutoff = SystemTime::now()
            .checked_sub(self.keep)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if live.iter().any(|id| name == **id) {
                continue;
            }
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t < cutoff);
            if old && entry.path().is_dir() {
                match std::fs::remove_dir_all(entry.path()) {
                    Ok(()) => removed += 1,
                    Err(e) => {
                        tracing::warn!(volume = %entry.path().display(), error = %e, "could not remove an old checkpoint volume")
                    }
                }
            }
        }
        removed
    }

    async fn run_hook(&self, action: &str, reservation_id: &str, dir: &Path, epoch: Option<&str>) {
        let Some(hook) = &self.hook else { return };
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(hook)
            .env("GPURENT_CHECKPOINT_ACTION", action)
            .env("GPURENT_RESERVATION_ID", reservation_id)
            .env("GPURENT_CHECKPOINT_DIR", dir)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some(epoch) = epoch {
            command.env("GPURENT_EPOCH", epoch);
        }
        let outcome = tokio::time::timeout(HOOK_TIMEOUT, command.status()).await;
        match outcome {
            Ok(Ok(status)) if status.success() => {
                tracing::info!(reservation_id, action, "checkpoint hook done");
            }
            Ok(Ok(status)) => {
                tracing::warn!(reservation_id, action, %status, "checkpoint hook failed");
            }
            Ok(Err(e)) => {
                tracing::warn!(reservation_id, action, error = %e, "checkpoint hook did not run");
            }
            Err(_) => {
                tracing::warn!(reservation_id, action, timeout = ?HOOK_TIMEOUT, "checkpoint hook timed out");
            }
        }
    }
}

fn set_owner_only(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}
