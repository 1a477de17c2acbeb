//! Gives a volume's whole tree to an instance's user. The tree is tenant-written, so the walk
//! goes from directory handle to directory handle and never follows a link out of it.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{fchownat, Gid, Uid};

/// Each level of the walk holds one open directory; past this depth it stops with an error
/// rather than run the agent out of file descriptors.
const MAX_DEPTH: usize = 512;

/// Makes `root` and everything under it owned by `uid`:`gid`, links themselves included (their
/// targets untouched). Skips the walk when `root` already has that owner: what the instance
/// makes afterwards is its own.
pub fn chown_tree(root: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(root)?;
    let meta = file.metadata()?;
    if meta.uid() == uid && meta.gid() == gid {
        return Ok(());
    }
    std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
    let (owner, group) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    let root_fd = OwnedFd::from(file);
    let entries = list(&root_fd)?;
    let mut stack = vec![(root_fd, entries)];
    while let Some((dir, entries)) = stack.last_mut() {
        let Some((name, is_dir)) = entries.pop() else {
            stack.pop();
            continue;
        };
        match fchownat(
            dir.as_fd(),
            name.as_os_str(),
            owner,
            group,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(()) => {}
            // Removed since it was listed.
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        }
        if !is_dir {
            continue;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let child = match openat(dir.as_fd(), name.as_os_str(), flags, Mode::empty()) {
            Ok(child) => child,
            // Replaced by a link or a file since it was listed: not followed.
            Err(
                nix::errno::Errno::ENOENT | nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR,
            ) => continue,
            Err(e) => return Err(e.into()),
        };
        if stack.len() >= MAX_DEPTH {
            return Err(std::io::Error::other(format!(
                "{} has directories nested deeper than {MAX_DEPTH}",
                root.display()
            )));
        }
        let entries = list(&child)?;
        stack.push((child, entries));
    }
    Ok(())
}

/// The entries of an open directory, each with whether it is a directory (not following
/// links). /proc/self/fd names the open directory itself, not a path that could be swapped.
fn list(dir: &OwnedFd) -> std::io::Result<Vec<(OsString, bool)>> {
    let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let is_dir = match entry.file_type() {
            Ok(kind) => kind.is_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        entries.push((entry.file_name(), is_dir));
    }
    Ok(entries)
}
