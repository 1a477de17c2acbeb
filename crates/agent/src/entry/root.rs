//! Reading an instance's root file system from the node (`/proc/PID/root`), every path and
//! symlink resolved inside that root (`openat2` with `RESOLVE_IN_ROOT`), never the node's.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

fn open_in_root(pid: i32, path: &str) -> std::io::Result<OwnedFd> {
    let root = nix::fcntl::open(
        Path::new(&format!("/proc/{pid}/root")),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    Ok(nix::fcntl::openat2(&root, path, how)?)
}

/// Whether `path` (links followed inside the root) is an executable file of the instance.
pub fn is_executable(pid: i32, path: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    open_in_root(pid, path)
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A file of the instance, up to 1 MiB of it.
pub fn read_small(pid: i32, path: &str) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::from(open_in_root(pid, path)?)
        .take(1 << 20)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// A user of the instance's `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

/// Parses `/etc/passwd` text.
pub fn passwd_entries(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 {
                return None;
            }
            Some(PasswdEntry {
                name: f[0].to_owned(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: f[5].to_owned(),
                shell: f[6].to_owned(),
            })
        })
        .collect()
}

/// The instance's user by name or number, from its `/etc/passwd` (None where it has none
/// or does not list the user).
pub fn passwd_entry(pid: i32, user: &str) -> Option<PasswdEntry> {
    let text = read_small(pid, "/etc/passwd").ok()?;
    passwd_entries(&text)
        .into_iter()
        .find(|e| e.name == user || user.parse::<u32>().is_ok_and(|u| u == e.uid))
}

/// The login shell of a user of the instance: theirs where it is an executable of the
/// instance, else `/bin/sh` where it has one; None where the image has no shell.
pub fn login_shell(pid: i32, entry: Option<&PasswdEntry>) -> Option<String> {
    entry
        .map(|e| e.shell.clone())
        .filter(|s| s.starts_with('/') && !s.ends_with("/nologin") && !s.ends_with("/false"))
        .filter(|s| is_executable(pid, s))
        .or_else(|| is_executable(pid, "/bin/sh").then(|| "/bin/sh".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines() {
        let text =
            "root:x:0:0:root:/root:/bin/ash\nbad line\nweb:x:33:44::/var/www:/sbin/nologin\n";
        let entries = passwd_entries(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].uid, 33);
        assert_eq!(entries[1].gid, 44);
        assert_eq!(entries[0].shell, "/bin/ash");
    }
}
