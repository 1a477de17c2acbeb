//! For tests of this and other crates: making sure no instance a test started outlives it.

use std::path::Path;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgrp, Pid};

/// SIGKILLs every process whose command line names `path` (an agent's data dir: the process
/// executor's wrappers name their instance dir), with its whole process group, except the
/// caller's own group, where only the process itself goes (daemons a test spawned share it).
/// An agent killed or aborted leaves its instances running, since a restarted one adopts them.
pub fn kill_processes_naming(path: &Path) {
    let needle = path.to_string_lossy().into_owned();
    let own = getpgrp();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(&needle) {
            continue;
        }
        match pgid_of(&entry.path()) {
            Some(pgid) if Pid::from_raw(pgid) != own => {
                let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            }
            _ => {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// Field 5 of `/proc/PID/stat`, after the parenthesised command name.
fn pgid_of(proc_dir: &Path) -> Option<i32> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// Unmounts whatever is mounted under `path` (the volumes and instances' disks of agents a
/// test killed), deepest first and lazily (an instance may still hold one for a moment), so
/// that removing the test's directory removes only what is the test's.
pub fn unmount_under(path: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = format!("{}/", path.to_string_lossy().trim_end_matches('/'));
    let mut points: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = std::process::Command::new("umount")
            .args(["-l", point])
            .status();
    }
}
