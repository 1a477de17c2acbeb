//! Volumes: a tenant's storage that outlives their instances (`gpurent volumes`), and how a
//! reservation mounts them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Money;

/// The smallest volume, in bytes (64 MiB).
pub const VOLUME_MIN_BYTES: u64 = 64 << 20;
/// The largest volume, in bytes (64 TiB).
pub const VOLUME_MAX_BYTES: u64 = 64 << 40;
/// The most volumes one reservation mounts.
pub const MOUNTS_MAX: usize = 16;
/// The protocol in the `Upgrade` header of `GET /api/v1/volumes/{name}/files`: SFTP v3 follows,
/// confined to the volume (`gpurent volumes cp`).
pub const VOLUME_FILES_UPGRADE: &str = "gpurent-sftp/1";

/// Where a volume lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VolumeKind {
    /// On one node's disk (its agent's `--volumes-dir`), its size enforced there: work that
    /// mounts it runs on that node.
    Local,
    /// On storage every node of the shared kind mounts (`--shared-volumes-dir`): work that
    /// mounts it runs on any of them, and moves with its data when its node is lost.
    Shared,
}

impl VolumeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeKind::Local => "local",
            VolumeKind::Shared => "shared",
        }
    }

    pub fn parse(s: &str) -> Option<VolumeKind> {
        match s {
            "local" => Some(VolumeKind::Local),
            "shared" => Some(VolumeKind::Shared),
            _ => None,
        }
    }
}

/// Where a volume is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VolumeState {
    /// Asked for; its node has not made it yet (a shared volume is made by the first instance
    /// that mounts it, and is `ready` at once).
    Creating,
    /// Made, at its size.
    Ready,
    /// Grown by `volumes resize`; its node has not grown it yet.
    Resizing,
    /// Its node is lost or not heard from: it comes back with the node, data and all.
    Unavailable,
    /// Removed by its owner; its node deletes it.
    Deleting,
    /// Its node could not make or grow it (`message` says why).
    Failed,
}

impl VolumeState {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeState::Creating => "creating",
            VolumeState::Ready => "ready",
            VolumeState::Resizing => "resizing",
            VolumeState::Unavailable => "unavailable",
            VolumeState::Deleting => "deleting",
            VolumeState::Failed => "failed",
        }
    }
}

/// `POST /api/v1/volumes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// 1 to 64 letters, digits and `- _ .`, unique among the owner's volumes.
    #[schema(pattern = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub name: String,
    /// Its size in bytes, 64 MiB to 64 TiB: what a write past fails at, and what is billed.
    pub size_bytes: u64,
    /// The node (its name or id) whose disk holds it. Neither `node` nor `shared`: the
    /// live node with the most room for volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// On the shared storage of the nodes that mount one (`--shared-volumes-dir`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// Make it for this team (a member or above): billed to the team, mounted by its
    /// reservations. A token bound to a team makes its team's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

/// `PATCH /api/v1/volumes/{name}`: a new size, larger than the one it has.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeVolume {
    pub size_bytes: u64,
}

/// A reservation using a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeUser {
    pub reservation_id: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    pub id: String,
    pub name: String,
    pub owner_id: String,
    pub kind: VolumeKind,
    pub size_bytes: u64,
    /// `size_bytes` in GB (10^9 bytes), as `--size` takes it.
    pub size_gb: f64,
    pub state: VolumeState,
    /// `state` again, by the name the command line's contract gives it.
    pub status: VolumeState,
    /// The node whose disk holds it (a local volume), by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// How its node enforces its size (`loop`, `project-quota`); none for a shared volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<String>,
    /// What its data takes, as its node last measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// The live reservations that mount it.
    #[serde(default)]
    pub used_by: Vec<VolumeUser>,
    /// Why it failed, in its node's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
    /// What it costs per GB (10^9 bytes) of its size per month (730 hours), charged per
    /// second while it exists.
    pub price_per_gb_month: Money,
    /// What it was charged so far.
    pub charged: Money,
    /// Since when its owner's balance has been below zero: its data is kept for the storage
    /// grace, then an admin may delete it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpaid_since: Option<DateTime<Utc>>,
    /// When its grace runs out (`unpaid_since` plus the server's storage grace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletable_after: Option<DateTime<Utc>>,
}

/// A volume to mount into a reservation's instance (`--volume NAME:/workspace[:ro]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountVolume {
    /// The volume's name (or id).
    pub volume: String,
    /// An absolute path inside the instance, not a system directory (`/workspace`).
    pub path: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

impl MountVolume {
    /// `NAME:PATH` or `NAME:PATH:ro` (`:rw` too), as the CLI's `--volume` and the console's
    /// form take it; a bare `NAME` has no path, which only a template's volume mount gives.
    pub fn parse(text: &str) -> Result<MountVolume, String> {
        let bad = || format!("{text:?} is not NAME:PATH or NAME:PATH:ro (data:/workspace)");
        let text = text.trim();
        if !text.is_empty() && !text.contains(':') {
            return Ok(MountVolume {
                volume: text.to_owned(),
                path: String::new(),
                read_only: false,
            });
        }
        let mut parts = text.splitn(3, ':');
        let (Some(volume), Some(path)) = (parts.next(), parts.next()) else {
            return Err(bad());
        };
        let read_only = match parts.next() {
            None | Some("rw") => false,
            Some("ro") => true,
            Some(_) => return Err(bad()),
        };
        if volume.is_empty() || path.is_empty() {
            return Err(bad());
        }
        Ok(MountVolume {
            volume: volume.to_owned(),
            path: path.to_owned(),
            read_only,
        })
    }
}

/// A volume a reservation mounts, as the reservation shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MountedVolume {
    pub volume_id: String,
    pub name: String,
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// `bytes` in GB (10^9 bytes): a size as a person reads it, exact to the byte below 2^53.
pub fn size_in_gb(bytes: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)] // sizes far below 2^53 bytes
    let gb = bytes as f64 / 1e9;
    gb
}

/// `1.5GB`, `100GB`, `64MiB`, `2TB`, `1073741824`: a size in bytes. `GB` and `TB` are powers
/// of ten, `GiB` and `TiB` of two; a bare number is bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim();
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?}: the unit {unit:?} is not one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
            ))
        }
    };
    let bad = || format!("{text:?} is not a size (100GB, 64MiB, 1.5TB)");
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let bytes = whole.checked_mul(scale).ok_or_else(bad)?;
    // The decimals exactly, as a fraction of the unit, rounded down to a byte.
    if fraction.len() > 12 || !fraction.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let numerator: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| bad())?
    };
    let denominator = 10_u128.pow(u32::try_from(fraction.len()).unwrap_or(12));
    let part = u64::try_from(u128::from(scale) * numerator / denominator).map_err(|_| bad())?;
    bytes.checked_add(part).ok_or_else(bad)
}

/// Bytes as a person reads them: `100 GB`, `64 MiB` where exact, else GB with one decimal.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 6] = [
        (1 << 40, "TiB"),
        (1_000_000_000_000, "TB"),
        (1 << 30, "GiB"),
        (1_000_000_000, "GB"),
        (1 << 20, "MiB"),
        (1_000_000, "MB"),
    ];
    for (scale, unit) in UNITS {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{} {unit}", bytes / scale);
        }
    }
    if bytes >= 1_000_000_000 {
        return format!(
            "{}.{} GB",
            bytes / 1_000_000_000,
            bytes % 1_000_000_000 / 100_000_000
        );
    }
    if bytes >= 1_000_000 {
        return format!("{}.{} MB", bytes / 1_000_000, bytes % 1_000_000 / 100_000);
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("100GB"), Ok(100_000_000_000));
        assert_eq!(parse_size("100 gb"), Ok(100_000_000_000));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1.5TB"), Ok(1_500_000_000_000));
        assert_eq!(parse_size("0.5GiB"), Ok(512 << 20));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        for bad in [
            "",
            "GB",
            "1.2.3GB",
            "10 parsecs",
            "-5GB",
            "99999999999999999999TB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mounts_read_as_name_path_and_mode() {
        let m = MountVolume::parse("data:/workspace").unwrap();
        assert_eq!(
            (m.volume.as_str(), m.path.as_str(), m.read_only),
            ("data", "/workspace", false)
        );
        assert!(MountVolume::parse(" sets:/data:ro ").unwrap().read_only);
        assert!(!MountVolume::parse("sets:/data:rw").unwrap().read_only);
        for bad in [":/x", "data:", "data:/x:rx", ""] {
            assert!(MountVolume::parse(bad).is_err(), "{bad}");
        }
        // A bare name: the template's volume mount gives its path.
        assert_eq!(MountVolume::parse("data").unwrap().path, "");
    }

    #[test]
    fn sizes_print_exactly_where_they_can() {
        assert_eq!(format_size(100_000_000_000), "100 GB");
        assert_eq!(format_size(64 << 20), "64 MiB");
        assert_eq!(format_size(1 << 40), "1 TiB");
        assert_eq!(format_size(1_234_567_890), "1.2 GB");
        assert_eq!(format_size(512), "512 B");
    }
}
