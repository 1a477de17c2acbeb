//! Shared volumes: plain directories under the owner's shared volumes directory, whatever file
//! system it is (NFS, CephFS, ...). Nothing bounds their size here; their usage is measured.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Inner, VolumeError};

pub(super) async fn ensure(inner: &Inner, id: &str) -> Result<PathBuf, VolumeError> {
    let dir = root(inner, id)?.join(id);
    match tokio::fs::create_dir(&dir).await {
        Ok(()) => tracing::info!(volume = id, "shared volume made"),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(VolumeError::io(id, "create", &dir)(e)),
    }
    // Whoever else writes the shared directory must not get an instance bound to a link.
    let meta = tokio::fs::symlink_metadata(&dir)
        .await
        .map_err(VolumeError::io(id, "inspect", &dir))?;
    if !meta.is_dir() {
        let not_dir = std::io::Error::other("it is not a directory");
        return Err(VolumeError::io(id, "use", &dir)(not_dir));
    }
    Ok(dir)
}

pub(super) async fn remove(inner: &Inner, id: &str) -> Result<(), VolumeError> {
    let dir = root(inner, id)?.join(id);
    let target = dir.clone();
    // std's remove_dir_all does not follow links; on a network file system it can be slow.
    let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&target))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|r| r);
    match removed {
        Ok(()) => {
            tracing::info!(volume = id, "shared volume deleted");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(VolumeError::io(id, "delete", &dir)(e)),
    }
}

pub(super) fn usage(inner: &Inner, id: &str) -> Result<u64, VolumeError> {
    let dir = root(inner, id)?.join(id);
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            let not_dir = std::io::Error::other("it is not a directory");
            return Err(VolumeError::io(id, "measure", &dir)(not_dir));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(VolumeError::NotFound {
                volume: id.to_owned(),
            })
        }
        Err(e) => return Err(VolumeError::io(id, "measure", &dir)(e)),
    }
    disk_usage(&dir).map_err(VolumeError::io(id, "measure", &dir))
}

fn root<'a>(inner: &'a Inner, id: &str) -> Result<&'a Path, VolumeError> {
    inner
        .shared_root
        .as_deref()
        .ok_or_else(|| VolumeError::NoSharedRoot {
            volume: id.to_owned(),
        })
}

/// The bytes allocated to everything under `dir`, as `du` counts them: links are not
/// followed, and a file with several hard links is counted once. Entries that vanish while
/// it walks are skipped.
pub(super) fn disk_usage(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0u64;
    let mut seen = HashSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total = total.saturating_add(meta.blocks().saturating_mul(512));
        if meta.is_dir() {
            let entries = match std::fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for entry in entries {
                match entry {
                    Ok(entry) => pending.push(entry.path()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(total)
}
