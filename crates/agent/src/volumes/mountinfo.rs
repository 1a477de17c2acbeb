//! Reads the kernel's mount table (/proc/self/mountinfo): what is mounted where, from what,
//! with which options. Mounts outlive the agent, so this, not memory, says what is mounted.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use super::VolumeError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mount {
    /// "major:minor" of the mounted file system.
    pub device_number: String,
    /// The directory of that file system this mount shows (not "/" for a bind mount).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// What it was mounted from, such as /dev/loop3.
    pub source: String,
    /// The per-mount and the file system's options, in that order.
    pub options: String,
}

impl Mount {
    /// Whether one of the options is `name` exactly.
    pub fn has_option(&self, name: &str) -> bool {
        self.options.split(',').any(|o| o == name)
    }
}

pub(super) fn read() -> Result<Vec<Mount>, VolumeError> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse(&text))
        .map_err(|source| VolumeError::MountTable { source })
}

/// Lines that do not have the documented shape are skipped.
pub(super) fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    // id parent major:minor root mount-point options [optional...] - type source super-options
    let (before, after) = line.split_once(" - ")?;
    let fields: Vec<&str> = before.split(' ').collect();
    let [_, _, device_number, root, mount_point, mount_options, ..] = fields.as_slice() else {
        return None;
    };
    let mut after = after.split(' ');
    let fs_type = after.next()?;
    let source = after.next()?;
    let super_options = after.next().unwrap_or("");
    Some(Mount {
        device_number: (*device_number).to_owned(),
        root: path(root),
        mount_point: path(mount_point),
        fs_type: fs_type.to_owned(),
        source: String::from_utf8_lossy(&unescape(source)).into_owned(),
        options: format!("{mount_options},{super_options}"),
    })
}

fn path(field: &str) -> PathBuf {
    PathBuf::from(OsString::from_vec(unescape(field)))
}

/// The kernel writes space, tab, newline and backslash as three octal digits after a backslash.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let digits = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(digits, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// How many mounts are stacked on `path` exactly.
pub(super) fn count_at(mounts: &[Mount], path: &Path) -> usize {
    mounts.iter().filter(|m| m.mount_point == path).count()
}

/// The mount that shows `path`: the deepest mount point above it, the last one where mounts are
/// stacked. `path` must be absolute and free of symlinks.
pub(super) fn containing<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .fold(None, |best: Option<&Mount>, m| match best {
            Some(b) if b.mount_point.components().count() > m.mount_point.components().count() => {
                Some(b)
            }
            _ => Some(m),
        })
}

/// Mounts anywhere in this mount namespace that show `dir` or something under it, as bind mounts
/// do: `dir` is busy while one exists.
pub(super) fn binds_of<'a>(mounts: &'a [Mount], dir: &Path) -> Vec<&'a Mount> {
    let Some(home) = containing(mounts, dir) else {
        return Vec::new();
    };
    let Ok(relative) = dir.strip_prefix(&home.mount_point) else {
        return Vec::new();
    };
    let in_fs = home.root.join(relative);
    mounts
        .iter()
        .filter(|m| m.device_number == home.device_number && m.root.starts_with(&in_fs))
        .filter(|m| m.mount_point != home.mount_point)
        .collect()
}
