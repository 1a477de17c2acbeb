//! Tenants' persistent volumes on a node: node-local ones under `--volumes-dir`, whose size
//! holds from inside an instance, and shared ones under `--shared-volumes-dir`, never bounded.

mod chown;
mod detect;
mod error;
mod loopback;
mod mountinfo;
mod quota;
mod shared;
mod tool;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use chown::chown_tree;
pub use error::VolumeError;
pub use quota::PROJECT_ID_BASE;

use quota::QuotaFs;
use tool::Tools;

/// The smallest node-local volume: below it ext4's own structures take most of the room.
pub const MIN_LOCAL_SIZE: u64 = 16 * 1024 * 1024;
/// Sizes are rounded up to whole file system blocks.
const BLOCK: u64 = 4096;

/// How this node bounds a node-local volume's size. Past it, a write in the instance fails and
/// the node's other files are untouched: with ENOSPC in a loop volume and on XFS, with EDQUOT
/// ("Disk quota exceeded") under an ext4 project quota, which a process with CAP_SYS_RESOURCE
/// passes, so instances must not have it. Shared volumes (NFS, CephFS, any POSIX file system)
/// have no bound here: give them the file system's own (CephFS directory quotas, NFS server
/// quotas) where they need one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enforcement {
    /// A directory on the volumes directory's file system with its own ext4 or XFS project quota.
    ProjectQuota,
    /// An ext4 image file of the volume's size, loop-mounted.
    Loop,
    /// No node-local volumes here, and why, in words for the host's owner.
    Unavailable(String),
}

impl Enforcement {
    pub fn as_str(&self) -> &str {
        match self {
            Enforcement::ProjectQuota => "project-quota",
            Enforcement::Loop => "loop",
            Enforcement::Unavailable(_) => "unavailable",
        }
    }

    /// Why volumes are unavailable, or the enforcement's name.
    fn reason(&self) -> &str {
        match self {
            Enforcement::Unavailable(reason) => reason,
            other => other.as_str(),
        }
    }
}

/// A node-local volume's figures in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeUsage {
    pub used_bytes: u64,
    pub size_bytes: u64,
}

/// The node's volumes. Cheap to clone; clones share one lock, so changes to local volumes
/// happen one at a time.
#[derive(Debug, Clone)]
pub struct VolumeStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    local_root: PathBuf,
    shared_root: Option<PathBuf>,
    is_root: bool,
    enforcement: Enforcement,
    quota: Option<QuotaFs>,
    tools: Tools,
    lock: tokio::sync::Mutex<()>,
}

impl VolumeStore {
    /// Opens the volumes directory (made 0700 and owned by root when missing) and chooses how
    /// sizes are enforced. `shared_root`, where given, must exist. As a non-root agent the
    /// directory is left as it is and node-local volumes are unavailable.
    pub fn open(local_root: PathBuf, shared_root: Option<PathBuf>) -> Result<Self, VolumeError> {
        let is_root = nix::unistd::geteuid().is_root();
        let local_root = if is_root {
            prepare_root(&local_root)?
        } else {
            std::fs::canonicalize(&local_root).unwrap_or(local_root)
        };
        let shared_root = shared_root
            .map(|path| match std::fs::canonicalize(&path) {
                Ok(resolved) if resolved.is_dir() => Ok(resolved),
                Ok(_) => Err(VolumeError::Root {
                    role: "shared",
                    path,
                    source: std::io::Error::other("it is not a directory"),
                }),
                Err(source) => Err(VolumeError::Root {
                    role: "shared",
                    path,
                    source,
                }),
            })
            .transpose()?;
        let tools = Tools::find_all();
        let mounts = mountinfo::read()?;
        let probe = detect::Probe {
            is_root,
            mount: mountinfo::containing(&mounts, &local_root),
            tools: &tools,
            loop_control: detect::loop_control(),
        };
        let (enforcement, quota) = detect::decide(&probe);
        let dir = local_root.display();
        match &enforcement {
            Enforcement::Unavailable(reason) => {
                tracing::warn!(%dir, %reason, "node-local volumes are unavailable");
            }
            e => tracing::info!(%dir, enforcement = e.as_str(), "node-local volumes"),
        }
        if enforcement == Enforcement::Loop && !loopback::can_resize_online() {
            tracing::warn!("the agent lacks CAP_SYS_RESOURCE: loop volumes grow only while unused");
        }
        Ok(VolumeStore {
            inner: Arc::new(Inner {
                local_root,
                shared_root,
                is_root,
                enforcement,
                quota,
                tools,
                lock: tokio::sync::Mutex::new(()),
            }),
        })
    }

    pub fn enforcement(&self) -> &Enforcement {
        &self.inner.enforcement
    }

    pub fn has_shared(&self) -> bool {
        self.inner.shared_root.is_some()
    }

    /// Bytes free for new volumes on the volumes directory's file system (statvfs's f_bavail
    /// times f_frsize). Sizes are promises, not reservations: see [`Self::promised_bytes`].
    pub fn free_bytes(&self) -> Result<u64, VolumeError> {
        let root = &self.inner.local_root;
        let stat = nix::sys::statvfs::statvfs(root.as_path()).map_err(|e| VolumeError::Root {
            role: "local",
            path: root.clone(),
            source: e.into(),
        })?;
        Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
    }

    /// Bytes the local volumes may still take from the file system beyond what they hold now
    /// (images are sparse and quotas only bound): subtract it from [`Self::free_bytes`] before
    /// promising a new volume, or a full disk makes writes fail with EIO instead of ENOSPC.
    pub fn promised_bytes(&self) -> Result<u64, VolumeError> {
        let inner = &self.inner;
        let mut total = 0u64;
        for id in inner.ids()? {
            let more = if inner.image(&id).exists() {
                loopback::unallocated(inner, &id)?
            } else {
                match quota::usage(inner, &id) {
                    Ok(u) => u.size_bytes.saturating_sub(u.used_bytes),
                    Err(VolumeError::NotFound { .. }) => 0,
                    Err(e) => return Err(e),
                }
            };
            total = total.saturating_add(more);
        }
        Ok(total)
    }

    /// The node-local volume `id`, made if missing, mounted if not (after an agent restart or a
    /// reboot; an existing image is never formatted again), grown when `size_bytes` is larger
    /// than it is (online; a loop volume unmounted where the agent lacks CAP_SYS_RESOURCE and
    /// nothing uses it). Shrinking is refused. Returns the directory to bind into an instance.
    pub async fn ensure_local(&self, id: &str, size_bytes: u64) -> Result<PathBuf, VolumeError> {
        check_id(id)?;
        let size = local_size(id, size_bytes)?;
        let inner = &self.inner;
        inner.check_root(id)?;
        let _one_at_a_time = inner.lock.lock().await;
        // A volume keeps the kind it was made with; only new ones follow the enforcement.
        if inner.image(id).exists() {
            return loopback::ensure(inner, id, size).await;
        }
        if inner.record(id).exists() {
            return quota::ensure(inner, id, size).await;
        }
        match &inner.enforcement {
            Enforcement::Loop => loopback::ensure(inner, id, size).await,
            Enforcement::ProjectQuota => quota::ensure(inner, id, size).await,
            Enforcement::Unavailable(reason) => Err(VolumeError::Unavailable {
                volume: id.to_owned(),
                reason: reason.clone(),
            }),
        }
    }

    /// The shared volume's directory, made if missing.
    pub async fn ensure_shared(&self, id: &str) -> Result<PathBuf, VolumeError> {
        check_id(id)?;
        shared::ensure(&self.inner, id).await
    }

    /// Unmounts and deletes the node-local volume; one that is gone is Ok. A volume in use
    /// (open files, a mount under it in the agent's mount namespace) is an error, never a lazy
    /// unmount. An instance in a mount namespace of its own keeps the data it has bound until
    /// it ends.
    pub async fn remove_local(&self, id: &str) -> Result<(), VolumeError> {
        check_id(id)?;
        let inner = &self.inner;
        inner.check_root(id)?;
        let _one_at_a_time = inner.lock.lock().await;
        let dir = inner.dir(id);
        let mounted = mountinfo::count_at(&mountinfo::read()?, &dir) > 0;
        if inner.image(id).exists() || mounted {
            loopback::remove(inner, id).await
        } else if inner.record(id).exists() || dir.exists() {
            quota::remove(inner, id).await
        } else {
            loopback::remove_leftovers(inner, id)
        }
    }

    pub async fn remove_shared(&self, id: &str) -> Result<(), VolumeError> {
        check_id(id)?;
        shared::remove(&self.inner, id).await
    }

    /// Used and provisioned bytes of a node-local volume: the mounted file system's figures
    /// for a loop volume, the project's usage for a quota one.
    pub fn usage_local(&self, id: &str) -> Result<VolumeUsage, VolumeError> {
        check_id(id)?;
        if self.inner.image(id).exists() {
            loopback::usage(&self.inner, id)
        } else {
            quota::usage(&self.inner, id)
        }
    }

    /// Bytes used by a shared volume, walking it (slow on a large tree over the network).
    pub fn usage_shared(&self, id: &str) -> Result<u64, VolumeError> {
        check_id(id)?;
        shared::usage(&self.inner, id)
    }

    /// The node-local volumes present, sorted.
    pub fn local_ids(&self) -> Result<Vec<String>, VolumeError> {
        self.inner.ids()
    }
}

impl Inner {
    fn image(&self, id: &str) -> PathBuf {
        self.local_root.join(format!("{id}.img"))
    }

    /// The volume's directory: a loop volume's mount point, a quota volume's directory.
    fn dir(&self, id: &str) -> PathBuf {
        self.local_root.join(id)
    }

    fn record(&self, id: &str) -> PathBuf {
        self.local_root.join(format!("{id}.quota"))
    }

    /// The agent's own files beside a volume; a leading dot keeps them apart from ids.
    fn hidden(&self, id: &str, what: &str) -> PathBuf {
        self.local_root.join(format!(".{id}.{what}"))
    }

    fn check_root(&self, id: &str) -> Result<(), VolumeError> {
        if self.is_root {
            return Ok(());
        }
        let reason = match &self.enforcement {
            Enforcement::Unavailable(reason) => reason.clone(),
            _ => "the agent is not running as root".to_owned(),
        };
        Err(VolumeError::Unavailable {
            volume: id.to_owned(),
            reason,
        })
    }

    /// Volumes are what has an image or a quota record; directories alone are leftovers.
    fn ids(&self) -> Result<Vec<String>, VolumeError> {
        let root = &self.local_root;
        let entries = match std::fs::read_dir(root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(VolumeError::Root {
                    role: "local",
                    path: root.clone(),
                    source,
                })
            }
        };
        let mut ids = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let id = name
                .strip_suffix(".img")
                .or_else(|| name.strip_suffix(".quota"));
            if let Some(id) = id.filter(|id| valid_id(id)) {
                ids.push(id.to_owned());
            }
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }
}

fn prepare_root(path: &Path) -> Result<PathBuf, VolumeError> {
    let error = |source| VolumeError::Root {
        role: "local",
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(path).map_err(error)?;
    std::os::unix::fs::lchown(path, Some(0), Some(0)).map_err(error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(error)?;
    // The mount table names resolved paths; so must the mount points made here.
    std::fs::canonicalize(path).map_err(error)
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_id(id: &str) -> Result<(), VolumeError> {
    if valid_id(id) {
        Ok(())
    } else {
        Err(VolumeError::InvalidId { id: id.to_owned() })
    }
}

/// The size rounded up to whole blocks, refused below [`MIN_LOCAL_SIZE`].
fn local_size(id: &str, size: u64) -> Result<u64, VolumeError> {
    if size < MIN_LOCAL_SIZE {
        return Err(VolumeError::TooSmall {
            volume: id.to_owned(),
            requested: size,
            minimum: MIN_LOCAL_SIZE,
        });
    }
    Ok(size
        .checked_next_multiple_of(BLOCK)
        .unwrap_or(u64::MAX - u64::MAX % BLOCK))
}

/// Bytes in use on the file system that shows `path`, as statvfs counts them.
fn statvfs_used(id: &str, path: &Path) -> Result<u64, VolumeError> {
    let stat = nix::sys::statvfs::statvfs(path)
        .map_err(|e| VolumeError::io(id, "measure", path)(e.into()))?;
    let used = stat.blocks().saturating_sub(stat.blocks_free());
    Ok(used.saturating_mul(stat.fragment_size()))
}

#[cfg(test)]
mod tests;
