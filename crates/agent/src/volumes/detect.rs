//! Chooses how this node enforces a volume's size: a project quota where the volumes
//! directory's file system has them on and the tools exist, else a loop-mounted image.

use std::path::Path;

use super::mountinfo::Mount;
use super::quota::{QuotaFs, QuotaKind};
use super::tool::Tools;
use super::Enforcement;

/// What the choice depends on, gathered from the system or made up by a test.
#[derive(Debug)]
pub(super) struct Probe<'a> {
    pub is_root: bool,
    /// The mount the volumes directory is on.
    pub mount: Option<&'a Mount>,
    pub tools: &'a Tools,
    /// Whether /dev/loop-control exists, which loop mounts need.
    pub loop_control: bool,
}

const LOOP_TOOLS: [&str; 5] = ["mkfs.ext4", "mount", "umount", "losetup", "resize2fs"];

/// The enforcement, and the file system's quota details where it is a project quota.
pub(super) fn decide(probe: &Probe<'_>) -> (Enforcement, Option<QuotaFs>) {
    if !probe.is_root {
        let reason = "the agent is not running as root, and both a project quota and a loop \
                      mount need root; run the agent as root to offer node-local volumes";
        return (Enforcement::Unavailable(reason.to_owned()), None);
    }
    let mut why_not_quota =
        "its file system is not mounted with project quotas (prjquota)".to_owned();
    if let Some(mount) = probe.mount {
        match quota_kind(mount) {
            Some((kind, tools)) => {
                let missing: Vec<&str> = tools
                    .iter()
                    .copied()
                    .filter(|t| !probe.tools.has(t))
                    .collect();
                if missing.is_empty() {
                    let fs = QuotaFs {
                        kind,
                        mount_point: mount.mount_point.clone(),
                    };
                    return (Enforcement::ProjectQuota, Some(fs));
                }
                why_not_quota = format!(
                    "its file system has project quotas but {} is not installed",
                    missing.join(" and ")
                );
            }
            None => {
                why_not_quota = format!(
                    "its file system ({}) is not ext4 or XFS mounted with prjquota",
                    mount.fs_type
                );
            }
        }
    }
    if !probe.loop_control {
        let reason = format!(
            "the volumes directory cannot have a project quota ({why_not_quota}) and this host \
             has no loop devices (/dev/loop-control is missing)"
        );
        return (Enforcement::Unavailable(reason), None);
    }
    let missing: Vec<&str> = LOOP_TOOLS
        .iter()
        .copied()
        .filter(|t| !probe.tools.has(t))
        .collect();
    if !missing.is_empty() {
        let reason = format!(
            "the volumes directory cannot have a project quota ({why_not_quota}) and loop \
             volumes need {} (e2fsprogs, util-linux), which is not installed",
            missing.join(", ")
        );
        return (Enforcement::Unavailable(reason), None);
    }
    (Enforcement::Loop, None)
}

fn quota_kind(mount: &Mount) -> Option<(QuotaKind, [&'static str; 2])> {
    match mount.fs_type.as_str() {
        "ext4" if mount.has_option("prjquota") => Some((QuotaKind::Ext4, ["chattr", "setquota"])),
        // XFS shows "prjquota" when enforcing and "pqnoenforce" when only counting.
        "xfs" if mount.has_option("prjquota") || mount.has_option("pquota") => {
            Some((QuotaKind::Xfs, ["chattr", "xfs_quota"]))
        }
        _ => None,
    }
}

/// Whether this host can make loop devices.
pub(super) fn loop_control() -> bool {
    Path::new("/dev/loop-control").exists()
}
