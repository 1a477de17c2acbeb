//! Loop volumes for real: made, mounted, filled past their size, found again after a restart
//! and a reboot, grown online and removed. They need root and skip without it.

use std::os::unix::fs::PermissionsExt;

use super::{fill, is_root, mounts_at, Scratch, MIB};
use crate::volumes::loopback::can_resize_online;
use crate::volumes::{Enforcement, VolumeError, VolumeStore};

/// A store on a scratch directory of this machine's file system, which has no project quotas,
/// so volumes are loop-mounted images.
fn loop_store(scratch: &Scratch) -> Option<VolumeStore> {
    if !is_root() {
        eprintln!("skipped: loop volumes need root");
        return None;
    }
    let store = VolumeStore::open(scratch.volumes(), None).unwrap();
    match store.enforcement() {
        Enforcement::Loop => Some(store),
        other => {
            eprintln!("skipped: the scratch directory gives {other:?}, not loop volumes");
            None
        }
    }
}

fn enospc(result: std::io::Result<()>) -> bool {
    matches!(result, Err(e) if e.raw_os_error() == Some(libc::ENOSPC))
}

#[tokio::test]
async fn volumes_loop_volume_holds_its_size_and_nothing_else() {
    let scratch = Scratch::new();
    let Some(store) = loop_store(&scratch) else {
        return;
    };
    let root_meta = std::fs::metadata(scratch.volumes()).unwrap();
    assert_eq!(root_meta.permissions().mode() & 0o777, 0o700);

    let dir = store.ensure_local("vol-a", 64 * MIB).await.unwrap();
    assert_eq!(dir, scratch.volumes().join("vol-a"));
    assert_eq!(mounts_at(&dir), 1);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "lost+found is gone"
    );
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
    assert_eq!(store.local_ids().unwrap(), ["vol-a"]);

    std::fs::write(dir.join("hello"), b"kept").unwrap();
    assert_eq!(std::fs::read(dir.join("hello")).unwrap(), b"kept");
    fill(&dir.join("ten"), 10).unwrap();
    let usage = store.usage_local("vol-a").unwrap();
    assert_eq!(usage.size_bytes, 64 * MIB);
    assert!(
        (10 * MIB..12 * MIB).contains(&usage.used_bytes),
        "{usage:?}"
    );

    assert!(enospc(fill(&dir.join("big"), 80)), "80 MiB fit in 64");
    // The node's file system is untouched: a file beside the volume still takes writes.
    fill(&scratch.path().join("beside"), 8).unwrap();
    std::fs::remove_file(dir.join("big")).unwrap();
    assert_eq!(std::fs::read(dir.join("hello")).unwrap(), b"kept");
}

#[tokio::test]
async fn volumes_loop_volume_survives_an_agent_restart_and_a_reboot() {
    let scratch = Scratch::new();
    let Some(store) = loop_store(&scratch) else {
        return;
    };
    let dir = store.ensure_local("vol-b", 64 * MIB).await.unwrap();
    std::fs::write(dir.join("data"), b"before").unwrap();
    drop(store);

    // The agent restarts while the volume stays mounted.
    let store = VolumeStore::open(scratch.volumes(), None).unwrap();
    assert_eq!(store.local_ids().unwrap(), ["vol-b"]);
    assert_eq!(store.ensure_local("vol-b", 64 * MIB).await.unwrap(), dir);
    assert_eq!(mounts_at(&dir), 1, "mounted twice");
    assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"before");

    // A reboot: nothing is mounted any more, and the image must not be formatted again.
    let status = std::process::Command::new("umount")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(mounts_at(&dir), 0);
    assert!(matches!(
        store.usage_local("vol-b"),
        Err(VolumeError::NotMounted { .. })
    ));
    let store = VolumeStore::open(scratch.volumes(), None).unwrap();
    assert_eq!(store.ensure_local("vol-b", 64 * MIB).await.unwrap(), dir);
    assert_eq!(mounts_at(&dir), 1);
    assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"before");
}

#[tokio::test]
async fn volumes_loop_volume_grows_online_and_never_shrinks() {
    let scratch = Scratch::new();
    let Some(store) = loop_store(&scratch) else {
        return;
    };
    let dir = store.ensure_local("vol-c", 64 * MIB).await.unwrap();
    fill(&dir.join("kept"), 20).unwrap();
    assert!(enospc(fill(&dir.join("big"), 80)));
    std::fs::remove_file(dir.join("big")).unwrap();

    // Grown while mounted; with CAP_SYS_RESOURCE also with a file held open across it.
    let online = can_resize_online();
    if !online {
        eprintln!("no CAP_SYS_RESOURCE here: the volume is grown unmounted");
        let held = std::fs::File::open(dir.join("kept")).unwrap();
        let err = store.ensure_local("vol-c", 128 * MIB).await.unwrap_err();
        assert!(matches!(err, VolumeError::CannotGrow { .. }), "{err}");
        assert!(err.to_string().contains("CAP_SYS_RESOURCE"), "{err}");
        assert_eq!(mounts_at(&dir), 1);
        drop(held);
    }
    let held = online.then(|| std::fs::File::open(dir.join("kept")).unwrap());
    assert_eq!(store.ensure_local("vol-c", 128 * MIB).await.unwrap(), dir);
    assert_eq!(mounts_at(&dir), 1);
    drop(held);
    assert_eq!(std::fs::metadata(dir.join("kept")).unwrap().len(), 20 * MIB);
    fill(&dir.join("big"), 80).unwrap();
    assert_eq!(store.usage_local("vol-c").unwrap().size_bytes, 128 * MIB);
    assert!(!scratch.volumes().join(".vol-c.grow").exists());

    let err = store.ensure_local("vol-c", 64 * MIB).await.unwrap_err();
    assert!(matches!(err, VolumeError::Shrink { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&(128 * MIB).to_string()) && text.contains(&(64 * MIB).to_string()),
        "{text}"
    );
    // The same size again changes nothing.
    assert_eq!(store.ensure_local("vol-c", 128 * MIB).await.unwrap(), dir);
    assert_eq!(mounts_at(&dir), 1);
}

#[tokio::test]
async fn volumes_loop_volume_is_removed_once_and_then_is_gone() {
    let scratch = Scratch::new();
    let Some(store) = loop_store(&scratch) else {
        return;
    };
    let dir = store.ensure_local("vol-d", 32 * MIB).await.unwrap();
    std::fs::write(dir.join("x"), b"x").unwrap();

    // A file open in the volume makes it busy; nothing is unmounted lazily.
    let held = std::fs::File::open(dir.join("x")).unwrap();
    let err = store.remove_local("vol-d").await.unwrap_err();
    assert!(matches!(err, VolumeError::Busy { .. }), "{err}");
    assert_eq!(mounts_at(&dir), 1);
    drop(held);

    store.remove_local("vol-d").await.unwrap();
    assert_eq!(mounts_at(&dir), 0);
    assert!(!dir.exists());
    assert!(!scratch.volumes().join("vol-d.img").exists());
    assert!(store.local_ids().unwrap().is_empty());
    store.remove_local("vol-d").await.unwrap();
    store.remove_local("never-made").await.unwrap();
    assert!(matches!(
        store.usage_local("vol-d"),
        Err(VolumeError::NotFound { .. })
    ));
    // Nothing is left beside: no markers, no half-made image.
    assert_eq!(std::fs::read_dir(scratch.volumes()).unwrap().count(), 0);
}

#[tokio::test]
async fn volumes_loop_space_is_sparse_and_reported_as_promised() {
    let scratch = Scratch::new();
    let Some(store) = loop_store(&scratch) else {
        return;
    };
    let free_before = store.free_bytes().unwrap();
    assert!(free_before > 0);
    store.ensure_local("vol-e", 256 * MIB).await.unwrap();
    let promised = store.promised_bytes().unwrap();
    // Most of the image is not allocated yet; the file system metadata is.
    assert!((200 * MIB..256 * MIB).contains(&promised), "{promised}");
}
