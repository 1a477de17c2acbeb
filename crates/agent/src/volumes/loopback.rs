//! Node-local volumes as sparse ext4 image files loop-mounted under the volumes directory:
//! `<root>/<id>.img` mounted at `<root>/<id>/`, with the size of the image.

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{mountinfo, statvfs_used, Inner, VolumeError, VolumeUsage};

/// Marks an image whose file system root still needs tidying (lost+found, mode) once mounted.
const FRESH: &str = "fresh";
/// Marks an image made larger whose file system may not have grown into it yet.
const GROW: &str = "grow";
/// An image being made; it becomes `<id>.img` only once mkfs has finished.
const NEW: &str = "img.new";
/// The capability's bit (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;

pub(super) async fn ensure(inner: &Inner, id: &str, size: u64) -> Result<PathBuf, VolumeError> {
    let image = inner.image(id);
    let dir = inner.dir(id);
    if !image.exists() {
        create(inner, id, size).await?;
    }
    let current = image_len(id, &image)?;
    if size < current {
        return Err(VolumeError::Shrink {
            volume: id.to_owned(),
            current,
            requested: size,
        });
    }
    // The marker is written before the image grows, so a crash between the two steps is
    // finished by the next call instead of leaving a file system smaller than its image.
    let grow = inner.hidden(id, GROW);
    if size > current {
        std::fs::write(&grow, b"").map_err(VolumeError::io(id, "write", &grow))?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .and_then(|f| f.set_len(size))
            .map_err(VolumeError::io(id, "grow", &image))?;
        tracing::info!(volume = id, from = current, to = size, "volume image grown");
    }
    if grow.exists() {
        if can_resize_online() {
            mount(inner, id).await?;
            grow_online(inner, id).await?;
        } else {
            grow_offline(inner, id).await?;
            mount(inner, id).await?;
        }
        remove_if_present(id, &grow)?;
    } else {
        mount(inner, id).await?;
    }
    let fresh = inner.hidden(id, FRESH);
    if fresh.exists() {
        tidy_root(id, &dir)?;
        remove_if_present(id, &fresh)?;
    }
    Ok(dir)
}

/// Makes the image under a temporary name so that an interrupted mkfs never leaves an
/// `<id>.img` behind: an existing image is never formatted again.
async fn create(inner: &Inner, id: &str, size: u64) -> Result<(), VolumeError> {
    let image = inner.image(id);
    let new = inner.hidden(id, NEW);
    remove_if_present(id, &new)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&new)
        .and_then(|f| f.set_len(size))
        .map_err(VolumeError::io(id, "create", &new))?;
    let args = [
        OsStr::new("-q"),
        OsStr::new("-F"),
        OsStr::new("-m"),
        OsStr::new("0"),
        // 4 KiB blocks even for a small volume, which mkfs would give 1 KiB blocks: that would
        // cap how far it can grow online.
        OsStr::new("-b"),
        OsStr::new("4096"),
        OsStr::new("-E"),
        OsStr::new("lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0"),
        new.as_os_str(),
    ];
    inner.tools.run(id, "mkfs.ext4", &args).await?;
    let fresh = inner.hidden(id, FRESH);
    std::fs::write(&fresh, b"").map_err(VolumeError::io(id, "write", &fresh))?;
    std::fs::rename(&new, &image).map_err(VolumeError::io(id, "rename", &new))?;
    tracing::info!(volume = id, size, "volume image made");
    Ok(())
}

/// Mounts the image unless the kernel's mount table already has it: the mount outlives the
/// agent, and after a restart instances may be using it.
async fn mount(inner: &Inner, id: &str) -> Result<(), VolumeError> {
    let dir = inner.dir(id);
    if mountinfo::count_at(&mountinfo::read()?, &dir) > 0 {
        return Ok(());
    }
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(VolumeError::io(id, "create", &dir)(e)),
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(VolumeError::io(id, "set the mode of", &dir))?;
    let image = inner.image(id);
    let args = [
        OsStr::new("-t"),
        OsStr::new("ext4"),
        OsStr::new("-o"),
        OsStr::new("loop,nodev,nosuid"),
        image.as_os_str(),
        dir.as_os_str(),
    ];
    inner.tools.run(id, "mount", &args).await?;
    // Direct I/O on the loop device: the image's blocks are cached once (by the volume's own
    // file system), not twice, and a volume reads at its disk's speed (buffered: a quarter).
    for device in loop_devices_of(&image) {
        let direct = [OsStr::new("--direct-io=on"), OsStr::new(&device)];
        if let Err(e) = inner.tools.run(id, "losetup", &direct).await {
            tracing::warn!(volume = id, %device, error = %e, "the volume's loop device reads and writes through the page cache");
        }
    }
    tracing::info!(volume = id, "volume mounted");
    Ok(())
}

/// Tenants find a new volume empty, and can list it.
fn tidy_root(id: &str, dir: &Path) -> Result<(), VolumeError> {
    let lost = dir.join("lost+found");
    match std::fs::remove_dir(&lost) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(VolumeError::io(id, "delete", &lost)(e)),
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(VolumeError::io(
        id,
        "set the mode of",
        dir,
    ))
}

/// Tells the loop device its file grew, then grows the mounted file system into it.
async fn grow_online(inner: &Inner, id: &str) -> Result<(), VolumeError> {
    let dir = inner.dir(id);
    let image = inner.image(id);
    let mounts = mountinfo::read()?;
    let Some(mount) = mounts.iter().rev().find(|m| m.mount_point == dir) else {
        return Err(VolumeError::NotMounted {
            volume: id.to_owned(),
            mount_point: dir,
        });
    };
    let device = mount.source.clone();
    let backing = Path::new(&device)
        .file_name()
        .map(|name| Path::new("/sys/block").join(name).join("loop/backing_file"))
        .and_then(|p| std::fs::read_to_string(p).ok());
    if backing.as_deref().map(str::trim_end) != Some(image.to_string_lossy().as_ref()) {
        return Err(VolumeError::ForeignMount {
            volume: id.to_owned(),
            mount_point: dir,
            device,
            image,
        });
    }
    let device = OsStr::new(&device);
    inner
        .tools
        .run(id, "losetup", &[OsStr::new("-c"), device])
        .await?;
    inner.tools.run(id, "resize2fs", &[device]).await?;
    tracing::info!(volume = id, "volume file system grown");
    Ok(())
}

/// Without CAP_SYS_RESOURCE the kernel refuses to resize a mounted ext4, so the volume is
/// grown unmounted, only when nothing anywhere has it mounted: an instance in a mount
/// namespace of its own keeps its loop device attached.
async fn grow_offline(inner: &Inner, id: &str) -> Result<(), VolumeError> {
    let dir = inner.dir(id);
    let image = inner.image(id);
    let in_use = |what: &str| VolumeError::CannotGrow {
        volume: id.to_owned(),
        reason: format!(
            "{what}, and the agent lacks CAP_SYS_RESOURCE, which growing a mounted volume needs"
        ),
    };
    if mountinfo::count_at(&mountinfo::read()?, &dir) > 0 {
        match inner.tools.run(id, "umount", &[dir.as_os_str()]).await {
            Ok(_) => {}
            Err(VolumeError::Tool { stderr, .. }) if stderr.contains("busy") => {
                return Err(in_use("it is in use"));
            }
            Err(e) => return Err(e),
        }
    }
    let devices = loop_devices_of(&image);
    if !devices.is_empty() {
        // Mounting again reuses the attached device, so both mounts share one file system.
        mount(inner, id).await?;
        return Err(in_use(&format!(
            "{} still has it mounted elsewhere",
            devices.join(", ")
        )));
    }
    let image = image.as_os_str();
    // resize2fs wants a freshly checked file system; e2fsck exits 1 when it repaired some.
    let check = [OsStr::new("-f"), OsStr::new("-p"), image];
    inner.tools.run_ok(id, "e2fsck", &check, &[0, 1]).await?;
    inner.tools.run(id, "resize2fs", &[image]).await?;
    tracing::info!(volume = id, "volume file system grown while unmounted");
    Ok(())
}

/// Whether this process may resize a mounted ext4 (CAP_SYS_RESOURCE in its effective set).
pub(super) fn can_resize_online() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return true;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_none_or(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// The loop devices whose backing file is `image`: one exists while anything has it mounted.
fn loop_devices_of(image: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let image = image.to_string_lossy();
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|b| b.trim_end() == image)
        })
        .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
        .collect()
}

/// Unmounts (never lazily: a busy volume is an error) and deletes the image.
pub(super) async fn remove(inner: &Inner, id: &str) -> Result<(), VolumeError> {
    let dir = inner.dir(id);
    // Mounts may be stacked on the mount point; each umount takes one off.
    for _ in 0..8 {
        if mountinfo::count_at(&mountinfo::read()?, &dir) == 0 {
            break;
        }
        match inner.tools.run(id, "umount", &[dir.as_os_str()]).await {
            Ok(_) => tracing::info!(volume = id, "volume unmounted"),
            Err(VolumeError::Tool { stderr, .. }) if stderr.contains("busy") => {
                return Err(VolumeError::Busy {
                    volume: id.to_owned(),
                    mount_point: dir,
                });
            }
            Err(e) => return Err(e),
        }
    }
    if mountinfo::count_at(&mountinfo::read()?, &dir) > 0 {
        return Err(VolumeError::Busy {
            volume: id.to_owned(),
            mount_point: dir,
        });
    }
    remove_if_present(id, &inner.image(id))?;
    remove_leftovers(inner, id)?;
    match std::fs::remove_dir(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(VolumeError::io(id, "delete", &dir)(e)),
    }
}

/// Deletes what an interrupted creation or growth may have left beside the image.
pub(super) fn remove_leftovers(inner: &Inner, id: &str) -> Result<(), VolumeError> {
    for marker in [FRESH, GROW, NEW] {
        remove_if_present(id, &inner.hidden(id, marker))?;
    }
    Ok(())
}

pub(super) fn usage(inner: &Inner, id: &str) -> Result<VolumeUsage, VolumeError> {
    let image = inner.image(id);
    if !image.exists() {
        return Err(VolumeError::NotFound {
            volume: id.to_owned(),
        });
    }
    let dir = inner.dir(id);
    // Unmounted, statvfs would measure the file system under the mount point instead.
    if mountinfo::count_at(&mountinfo::read()?, &dir) == 0 {
        return Err(VolumeError::NotMounted {
            volume: id.to_owned(),
            mount_point: dir,
        });
    }
    Ok(VolumeUsage {
        used_bytes: statvfs_used(id, &dir)?,
        size_bytes: image_len(id, &image)?,
    })
}

/// What the sparse image may still take from the file system it lives on.
pub(super) fn unallocated(inner: &Inner, id: &str) -> Result<u64, VolumeError> {
    let image = inner.image(id);
    let meta = std::fs::metadata(&image).map_err(VolumeError::io(id, "inspect", &image))?;
    Ok(meta.len().saturating_sub(meta.blocks().saturating_mul(512)))
}

fn image_len(id: &str, image: &Path) -> Result<u64, VolumeError> {
    std::fs::metadata(image)
        .map(|m| m.len())
        .map_err(VolumeError::io(id, "inspect", image))
}

fn remove_if_present(id: &str, path: &Path) -> Result<(), VolumeError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(VolumeError::io(id, "delete", path)(e)),
    }
}
