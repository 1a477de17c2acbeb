//! Tests of volumes: pure parts here, real loop mounts and project quotas in the submodules.

mod loopback;
mod quota;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::detect::{decide, Probe};
use super::mountinfo::{self, Mount};
use super::quota::{limit_args, QuotaFs, QuotaKind};
use super::tool::Tools;
use super::*;

const MIB: u64 = 1024 * 1024;

pub(super) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A temporary directory that unmounts whatever is mounted under it when dropped, also when a
/// test fails halfway.
pub(super) struct Scratch {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap();
        Scratch { path, _dir: dir }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn volumes(&self) -> PathBuf {
        self.path.join("volumes")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for _ in 0..16 {
            let mounts = mountinfo::read().unwrap_or_default();
            let Some(last) = mounts
                .iter()
                .rev()
                .find(|m| m.mount_point.starts_with(&self.path))
            else {
                return;
            };
            let point = last.mount_point.clone();
            let ok = std::process::Command::new("umount")
                .arg(&point)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&point)
                    .status();
            }
        }
    }
}

/// Writes `mib` MiB of non-zero bytes to `path` and syncs them.
pub(super) fn fill(path: &Path, mib: u64) -> std::io::Result<()> {
    let chunk = vec![0x5a_u8; 1024 * 1024];
    let mut file = std::fs::File::create(path)?;
    for _ in 0..mib {
        file.write_all(&chunk)?;
    }
    file.sync_all()
}

pub(super) fn mounts_at(path: &Path) -> usize {
    mountinfo::count_at(&mountinfo::read().unwrap(), path)
}

fn mount(fs_type: &str, options: &str) -> Mount {
    Mount {
        device_number: "8:1".into(),
        root: "/".into(),
        mount_point: "/srv".into(),
        fs_type: fs_type.into(),
        source: "/dev/sda1".into(),
        options: options.into(),
    }
}

const LOOP: [&str; 5] = ["mkfs.ext4", "mount", "umount", "losetup", "resize2fs"];

#[test]
fn volumes_detection_needs_root_and_says_so() {
    let tools = Tools::with(&LOOP);
    let ext4 = mount("ext4", "rw,relatime,rw,prjquota");
    let probe = Probe {
        is_root: false,
        mount: Some(&ext4),
        tools: &tools,
        loop_control: true,
    };
    let (enforcement, quota) = decide(&probe);
    let Enforcement::Unavailable(reason) = &enforcement else {
        panic!("{enforcement:?}");
    };
    assert!(reason.contains("not running as root"), "{reason}");
    assert_eq!(enforcement.as_str(), "unavailable");
    assert!(quota.is_none());
}

#[test]
fn volumes_detection_prefers_a_project_quota_with_its_tools() {
    let all = Tools::with(&[
        "mkfs.ext4",
        "mount",
        "umount",
        "losetup",
        "resize2fs",
        "chattr",
        "setquota",
        "xfs_quota",
    ]);
    let cases = [
        ("ext4", "rw,relatime,rw,prjquota", Some(QuotaKind::Ext4)),
        (
            "xfs",
            "rw,noatime,rw,attr2,inode64,prjquota",
            Some(QuotaKind::Xfs),
        ),
        ("xfs", "rw,rw,pquota", Some(QuotaKind::Xfs)),
        ("ext4", "rw,relatime,rw,usrquota", None),
        ("xfs", "rw,rw,pqnoenforce", None),
        ("btrfs", "rw,prjquota", None),
    ];
    for (fs_type, options, kind) in cases {
        let m = mount(fs_type, options);
        let probe = Probe {
            is_root: true,
            mount: Some(&m),
            tools: &all,
            loop_control: true,
        };
        let (enforcement, quota) = decide(&probe);
        match kind {
            Some(kind) => {
                assert_eq!(
                    enforcement,
                    Enforcement::ProjectQuota,
                    "{fs_type} {options}"
                );
                let expected = QuotaFs {
                    kind,
                    mount_point: "/srv".into(),
                };
                assert_eq!(quota, Some(expected));
            }
            None => assert_eq!(enforcement, Enforcement::Loop, "{fs_type} {options}"),
        }
    }
}

#[test]
fn volumes_detection_falls_back_to_loop_or_says_what_is_missing() {
    let ext4 = mount("ext4", "rw,relatime,rw,prjquota");
    let only_loop = Tools::with(&LOOP);
    let probe = Probe {
        is_root: true,
        mount: Some(&ext4),
        tools: &only_loop,
        loop_control: true,
    };
    assert_eq!(decide(&probe).0, Enforcement::Loop);

    let nothing = Tools::with(&[]);
    let probe = Probe {
        tools: &nothing,
        ..probe
    };
    let Enforcement::Unavailable(reason) = decide(&probe).0 else {
        panic!("volumes without tools");
    };
    assert!(
        reason.contains("setquota") && reason.contains("mkfs.ext4"),
        "{reason}"
    );

    let probe = Probe {
        tools: &only_loop,
        loop_control: false,
        ..probe
    };
    let Enforcement::Unavailable(reason) = decide(&probe).0 else {
        panic!("volumes without loop devices");
    };
    assert!(reason.contains("loop devices"), "{reason}");
}

#[test]
fn volumes_mountinfo_is_parsed_with_escapes() {
    let text = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,prjquota
40 22 7:0 / /srv/vol\\040a rw,nosuid,nodev - ext4 /dev/loop0 rw
41 22 254:0 /srv/data/v1 /run/inst rw master:2 - ext4 /dev/vda rw,prjquota
garbage line
";
    let mounts = mountinfo::parse(text);
    assert_eq!(mounts.len(), 3);
    assert_eq!(mounts[1].mount_point, Path::new("/srv/vol a"));
    assert_eq!(mounts[1].source, "/dev/loop0");
    assert!(mounts[1].has_option("nodev") && !mounts[1].has_option("dev"));
    assert!(mounts[0].has_option("prjquota"));
    let home = mountinfo::containing(&mounts, Path::new("/srv/vol a/x")).unwrap();
    assert_eq!(home.source, "/dev/loop0");
    let home = mountinfo::containing(&mounts, Path::new("/srv/vol")).unwrap();
    assert_eq!(home.mount_point, Path::new("/"));
    assert_eq!(mountinfo::count_at(&mounts, Path::new("/srv/vol a")), 1);
    // A bind mount of a quota volume's directory makes it busy.
    let binds = mountinfo::binds_of(&mounts, Path::new("/srv/data/v1"));
    assert_eq!(binds.len(), 1);
    assert!(mountinfo::binds_of(&mounts, Path::new("/srv/data/v2")).is_empty());
}

#[test]
fn volumes_ids_that_could_climb_out_are_refused() {
    for bad in [
        "",
        "../x",
        "..",
        ".",
        "a/b",
        "a b",
        "x.img",
        "é",
        &"a".repeat(65),
    ] {
        assert!(!valid_id(bad), "{bad:?}");
        assert!(matches!(check_id(bad), Err(VolumeError::InvalidId { .. })));
    }
    for good in ["a", "vol-1_B", &"z".repeat(64)] {
        assert!(valid_id(good), "{good:?}");
    }
}

#[tokio::test]
async fn volumes_every_entry_point_refuses_a_bad_id() {
    let scratch = Scratch::new();
    let shared = scratch.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let store = VolumeStore::open(scratch.volumes(), Some(shared)).unwrap();
    for bad in ["../x", ""] {
        let invalid = |r: Result<(), VolumeError>| matches!(r, Err(VolumeError::InvalidId { .. }));
        assert!(invalid(store.ensure_local(bad, 64 * MIB).await.map(drop)));
        assert!(invalid(store.ensure_shared(bad).await.map(drop)));
        assert!(invalid(store.remove_local(bad).await));
        assert!(invalid(store.remove_shared(bad).await));
        assert!(invalid(store.usage_local(bad).map(drop)));
        assert!(invalid(store.usage_shared(bad).map(drop)));
    }
    assert!(!scratch.path().join("x").exists());
}

#[test]
fn volumes_sizes_are_whole_blocks_and_not_tiny() {
    assert_eq!(local_size("v", 64 * MIB).unwrap(), 64 * MIB);
    assert_eq!(local_size("v", 64 * MIB + 1).unwrap(), 64 * MIB + 4096);
    assert!(local_size("v", u64::MAX).is_ok());
    let err = local_size("v", 1024).unwrap_err();
    assert!(matches!(err, VolumeError::TooSmall { .. }), "{err}");
}

#[test]
fn volumes_quota_limits_are_set_in_kib() {
    let ext4 = QuotaFs {
        kind: QuotaKind::Ext4,
        mount_point: "/srv".into(),
    };
    let args = limit_args(&ext4, PROJECT_ID_BASE, 64 * MIB);
    let expected = ["-P", "1735393280", "0", "65536", "0", "0", "/srv"];
    assert_eq!(args, expected.map(std::ffi::OsString::from));
    let xfs = QuotaFs {
        kind: QuotaKind::Xfs,
        mount_point: "/data dir".into(),
    };
    let args = limit_args(&xfs, 7, 0);
    let expected = ["-x", "-c", "limit -p bhard=0k 7", "/data dir"];
    assert_eq!(args, expected.map(std::ffi::OsString::from));
}

#[tokio::test]
async fn volumes_shared_ones_are_made_measured_and_removed() {
    let scratch = Scratch::new();
    let shared = scratch.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let store = VolumeStore::open(scratch.volumes(), Some(shared.clone())).unwrap();
    assert!(store.has_shared());
    let dir = store.ensure_shared("team-data").await.unwrap();
    assert_eq!(dir, shared.join("team-data"));
    assert_eq!(store.ensure_shared("team-data").await.unwrap(), dir);
    fill(&dir.join("a"), 3).unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    fill(&dir.join("sub/b"), 2).unwrap();
    // A hard link is counted once, and a link to outside is not followed.
    std::fs::hard_link(dir.join("a"), dir.join("sub/a-again")).unwrap();
    fill(&scratch.path().join("outside"), 4).unwrap();
    std::os::unix::fs::symlink(scratch.path().join("outside"), dir.join("out")).unwrap();
    let used = store.usage_shared("team-data").unwrap();
    assert!((5 * MIB..6 * MIB).contains(&used), "{used}");
    store.remove_shared("team-data").await.unwrap();
    assert!(!dir.exists());
    assert!(scratch.path().join("outside").exists());
    store.remove_shared("team-data").await.unwrap();
    assert!(matches!(
        store.usage_shared("team-data"),
        Err(VolumeError::NotFound { .. })
    ));
}

#[tokio::test]
async fn volumes_without_a_shared_dir_say_so() {
    let scratch = Scratch::new();
    let store = VolumeStore::open(scratch.volumes(), None).unwrap();
    assert!(!store.has_shared());
    let err = store.ensure_shared("x").await.unwrap_err();
    assert!(err.to_string().contains("--shared-volumes-dir"), "{err}");
    let missing = VolumeStore::open(scratch.volumes(), Some(scratch.path().join("nope")));
    assert!(matches!(
        missing,
        Err(VolumeError::Root { role: "shared", .. })
    ));
}

#[test]
fn volumes_chown_tree_never_follows_a_link_out() {
    if !is_root() {
        eprintln!("skipped: chown needs root");
        return;
    }
    let scratch = Scratch::new();
    let tree = scratch.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
    std::fs::write(tree.join("a/b/c/file"), b"x").unwrap();
    let secret = scratch.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("key"), b"k").unwrap();
    // The tenant's links: to a file outside, and a directory link to climb through.
    std::os::unix::fs::symlink(secret.join("key"), tree.join("a/key")).unwrap();
    std::os::unix::fs::symlink(&secret, tree.join("a/b/up")).unwrap();
    chown_tree(&tree, 4242, 4343).unwrap();
    for path in ["", "a", "a/b", "a/b/c", "a/b/c/file", "a/key", "a/b/up"] {
        let meta = std::fs::symlink_metadata(tree.join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (4242, 4343), "{path}");
    }
    for outside in [secret.clone(), secret.join("key")] {
        let meta = std::fs::metadata(&outside).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "{}", outside.display());
    }
    // Already owned: nothing is walked, so a file given back to root stays root's.
    std::os::unix::fs::lchown(tree.join("a/b/c/file"), Some(0), Some(0)).unwrap();
    chown_tree(&tree, 4242, 4343).unwrap();
    assert_eq!(std::fs::metadata(tree.join("a/b/c/file")).unwrap().uid(), 0);
    // The root itself must not be a link.
    std::os::unix::fs::symlink(&secret, scratch.path().join("link")).unwrap();
    assert!(chown_tree(&scratch.path().join("link"), 1, 1).is_err());
    assert_eq!(std::fs::metadata(&secret).unwrap().uid(), 0);
}
