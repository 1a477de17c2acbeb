//! Runs the system tools volumes are made with (mkfs.ext4, mount, setquota, ...), turning a
//! failure into an error that names the volume, the command and what the tool wrote to stderr.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use super::VolumeError;

/// Long enough for an online resize2fs of a large volume; a tool past it is killed.
const TOOL_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Where the tools are looked for after $PATH: an agent started by an init system may have a
/// $PATH without the sbin directories.
const SYSTEM_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

const ALL: [&str; 9] = [
    "mkfs.ext4",
    "e2fsck",
    "mount",
    "umount",
    "losetup",
    "resize2fs",
    "chattr",
    "setquota",
    "xfs_quota",
];

/// The tools found when the store was opened, by name.
#[derive(Debug, Clone, Default)]
pub(super) struct Tools {
    found: BTreeMap<&'static str, PathBuf>,
}

impl Tools {
    pub fn find_all() -> Tools {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs: Vec<PathBuf> = std::env::split_paths(&path)
            .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
            .collect();
        let found = ALL
            .iter()
            .filter_map(|name| {
                let path = dirs.iter().map(|d| d.join(name)).find(|p| executable(p))?;
                Some((*name, path))
            })
            .collect();
        Tools { found }
    }

    #[cfg(test)]
    pub fn with(names: &[&'static str]) -> Tools {
        Tools {
            found: names.iter().map(|n| (*n, PathBuf::from(n))).collect(),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.found.contains_key(name)
    }

    /// Runs tool `name` for `volume` and returns its stdout.
    pub async fn run(
        &self,
        volume: &str,
        name: &'static str,
        args: &[&OsStr],
    ) -> Result<String, VolumeError> {
        self.run_ok(volume, name, args, &[0]).await
    }

    /// Runs tool `name`, taking the exit codes in `ok` as success (e2fsck says 1 when it
    /// repaired something).
    pub async fn run_ok(
        &self,
        volume: &str,
        name: &'static str,
        args: &[&OsStr],
        ok: &[i32],
    ) -> Result<String, VolumeError> {
        let Some(program) = self.found.get(name) else {
            return Err(VolumeError::MissingTool {
                volume: volume.to_owned(),
                tool: name,
            });
        };
        let command = describe(name, args);
        let child = Command::new(program)
            .args(args)
            // The tools' messages are matched on ("target is busy"), so they must be in English.
            .env("LC_ALL", "C")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = match tokio::time::timeout(TOOL_TIMEOUT, child).await {
            Ok(Ok(output)) => output,
            Ok(Err(source)) => {
                return Err(VolumeError::Spawn {
                    volume: volume.to_owned(),
                    command,
                    source,
                })
            }
            Err(_) => {
                return Err(VolumeError::ToolTimedOut {
                    volume: volume.to_owned(),
                    command,
                    after: TOOL_TIMEOUT,
                })
            }
        };
        if !output.status.code().is_some_and(|code| ok.contains(&code)) {
            return Err(VolumeError::Tool {
                volume: volume.to_owned(),
                command,
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

fn executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn describe(name: &str, args: &[&OsStr]) -> String {
    let mut text = name.to_owned();
    for arg in args {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}
