//! Project-quota volumes for real, on a scratch ext4 or XFS image mounted with prjquota; they
//! skip, saying why, without root, the quota tools or a kernel with quotas (nothing is installed).

use std::process::Command;

use super::{fill, is_root, Scratch, MIB};
use crate::volumes::tool::Tools;
use crate::volumes::{Enforcement, VolumeError, VolumeStore};

/// Makes and mounts a file system with project quotas at `<scratch>/fs`, or says why not.
fn quota_fs(scratch: &Scratch, fs_type: &str) -> Result<(), String> {
    if !is_root() {
        return Err("project quotas need root".into());
    }
    let tools = Tools::find_all();
    let needed = match fs_type {
        "ext4" => ["chattr", "setquota"],
        _ => ["chattr", "xfs_quota"],
    };
    if let Some(missing) = needed.iter().find(|t| !tools.has(t)) {
        return Err(format!("{missing} is not installed"));
    }
    let image = scratch.path().join("fs.img");
    let mount_point = scratch.path().join("fs");
    std::fs::create_dir(&mount_point).map_err(|e| e.to_string())?;
    // XFS will not make a file system under 300 MB.
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(512 * MIB))
        .map_err(|e| e.to_string())?;
    let mkfs = match fs_type {
        "ext4" => Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "quota,project"])
            .arg(&image)
            .output(),
        _ => Command::new("mkfs.xfs").arg("-q").arg(&image).output(),
    };
    let mkfs = mkfs.map_err(|e| format!("mkfs.{fs_type}: {e}"))?;
    if !mkfs.status.success() {
        return Err(format!(
            "mkfs.{fs_type}: {}",
            String::from_utf8_lossy(&mkfs.stderr).trim()
        ));
    }
    let mount = Command::new("mount")
        .args(["-o", "loop,prjquota"])
        .arg(&image)
        .arg(&mount_point)
        .output()
        .map_err(|e| e.to_string())?;
    if !mount.status.success() {
        return Err(format!(
            "this kernel cannot mount {fs_type} with project quotas: {}",
            String::from_utf8_lossy(&mount.stderr).trim()
        ));
    }
    Ok(())
}

/// The errno a write past the size gets: ext4's project quota says EDQUOT, XFS's ENOSPC.
fn past_size(result: std::io::Result<()>) -> Option<i32> {
    result
        .err()
        .and_then(|e| e.raw_os_error())
        .filter(|errno| [libc::EDQUOT, libc::ENOSPC].contains(errno))
}

async fn quota_story(fs_type: &str, errno: i32) {
    let scratch = Scratch::new();
    if let Err(why) = quota_fs(&scratch, fs_type) {
        eprintln!("skipped: {why}");
        return;
    }
    let root = scratch.path().join("fs/volumes");
    let store = VolumeStore::open(root.clone(), None).unwrap();
    assert_eq!(store.enforcement(), &Enforcement::ProjectQuota);

    let dir = store.ensure_local("q-1", 32 * MIB).await.unwrap();
    assert_eq!(dir, root.join("q-1"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    fill(&dir.join("eight"), 8).unwrap();
    let usage = store.usage_local("q-1").unwrap();
    assert_eq!(usage.size_bytes, 32 * MIB);
    assert!((8 * MIB..9 * MIB).contains(&usage.used_bytes), "{usage:?}");

    assert_eq!(past_size(fill(&dir.join("big"), 40)), Some(errno));
    // The same file system outside the volume still takes writes.
    fill(&scratch.path().join("fs/beside"), 40).unwrap();
    std::fs::remove_file(dir.join("big")).unwrap();

    // A restart finds it; growing raises the quota; shrinking is refused.
    let store = VolumeStore::open(root.clone(), None).unwrap();
    assert_eq!(store.local_ids().unwrap(), ["q-1"]);
    assert_eq!(store.ensure_local("q-1", 64 * MIB).await.unwrap(), dir);
    fill(&dir.join("big"), 40).unwrap();
    let err = store.ensure_local("q-1", 32 * MIB).await.unwrap_err();
    assert!(matches!(err, VolumeError::Shrink { .. }), "{err}");

    // A second volume gets a project of its own.
    let other = store.ensure_local("q-2", 16 * MIB).await.unwrap();
    assert_eq!(past_size(fill(&other.join("big"), 20)), Some(errno));

    store.remove_local("q-1").await.unwrap();
    assert!(!dir.exists());
    store.remove_local("q-1").await.unwrap();
    assert_eq!(store.local_ids().unwrap(), ["q-2"]);
}

#[tokio::test]
async fn volumes_ext4_project_quota_bounds_a_volume() {
    quota_story("ext4", libc::EDQUOT).await;
}

#[tokio::test]
async fn volumes_xfs_project_quota_bounds_a_volume() {
    quota_story("xfs", libc::ENOSPC).await;
}
