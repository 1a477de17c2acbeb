//! What `/proc` says about the node's processes: their uids, start times, environments,
//! states and process groups.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;

use nix::sys::signal::killpg;
use nix::unistd::Pid;

/// The real uid of a process, from `/proc/PID/status`.
pub(crate) fn process_uid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// When a process started (clock ticks after boot, `/proc/PID/stat`'s 22nd field).
pub(super) fn process_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after `pid (comm)` begin with the 3rd, state.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// The environment a process started with, from `/proc/PID/environ`.
pub(super) fn process_environment(pid: i32) -> Vec<(OsString, OsString)> {
    use std::os::unix::ffi::OsStrExt;
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|&b| b == 0)
        .filter_map(|var| {
            let eq = var.iter().position(|&b| b == b'=')?;
            let name = std::ffi::OsStr::from_bytes(&var[..eq]);
            let value = std::ffi::OsStr::from_bytes(&var[eq + 1..]);
            Some((name.to_owned(), value.to_owned()))
        })
        .collect()
}

/// The real uids of the node's processes.
pub(super) fn process_uids() -> BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(process_uid)
        .collect()
}

/// A process's state letter (`R`, `S`, `Z`...), from `/proc/PID/stat`.
pub(super) fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`; the name may hold spaces and parentheses.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether a process of the group still runs. Zombies do not count: a killed workload's
/// children are orphaned to the init process, which may take a while to reap them. The
/// group's leader (the instance's wrapper, which lives as long as it does) is asked first:
/// only once it has ended is all of `/proc` read, which costs a read per process of the node.
pub(super) fn group_runs(pgid: i32) -> bool {
    if killpg(Pid::from_raw(pgid), None).is_err() {
        return false;
    }
    if leads_running_group(pgid) {
        return true;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries
        .flatten()
        .any(|e| runs_in_group(&e.path().join("stat"), pgid))
}

/// Whether the process `pgid` runs and leads its group (a pid taken again by another process
/// leads no group of that id).
fn leads_running_group(pgid: i32) -> bool {
    runs_in_group(Path::new(&format!("/proc/{pgid}/stat")), pgid)
}

/// Whether the process of this `/proc/PID/stat` is in group `pgid` and not a zombie.
fn runs_in_group(stat: &Path, pgid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(stat) else {
        return false;
    };
    // `pid (comm) state ppid pgrp ...`; the name may hold spaces and parentheses.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next();
    let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
    pgrp == Some(pgid) && state != Some("Z")
}

/// The process group of `pid`, from `/proc/PID/stat` (the field after state and ppid).
pub(super) fn process_group_of(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: read after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}
