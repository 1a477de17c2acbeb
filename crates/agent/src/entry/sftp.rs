//! Where the SFTP helper (`gpurent instance-sftp`, a hidden subcommand of the one binary)
//! serves an instance: the process whose root it enters, the user it becomes, its home.

use std::path::PathBuf;

/// The binary that runs the helper: by default this one.
pub fn default_helper() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"))
}

/// An SFTP helper's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftpTarget {
    /// A process of the instance whose mount namespace and root the helper enters (None:
    /// the node's, for an unisolated instance).
    pub root_of: Option<i32>,
    /// A directory the helper makes its root instead (a volume served with no instance).
    pub chroot: Option<PathBuf>,
    /// (uid, gid) it becomes; None: it stays the agent's user.
    pub user: Option<(u32, u32)>,
    /// Its working directory, where relative paths start.
    pub home: String,
}

impl SftpTarget {
    /// The helper's arguments after `instance-sftp`.
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(pid) = self.root_of {
            args.extend(["--pid".to_owned(), pid.to_string()]);
        }
        if let Some(dir) = &self.chroot {
            args.extend(["--chroot".to_owned(), dir.to_string_lossy().into_owned()]);
        }
        if let Some((uid, gid)) = self.user {
            args.extend([
                "--uid".to_owned(),
                uid.to_string(),
                "--gid".to_owned(),
                gid.to_string(),
            ]);
        }
        args.extend(["--home".to_owned(), self.home.clone()]);
        args
    }
}

/// Serves a volume's files with no instance (`gpurent volumes cp`): the helper makes `dir` its
/// root and becomes the user who owns it (the last instance that wrote it), so that every path
/// and symlink resolves inside the volume and nothing else on the node can be reached. Making
/// a root needs the agent to run as root.
pub fn serve_volume(
    helper: &std::path::Path,
    volume_id: &str,
    dir: &std::path::Path,
) -> Result<super::Entered, String> {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return Err("this node's agent does not run as root, so it cannot confine a volume's files to the volume; copy them through an instance (gpurent cp)".to_owned());
    }
    let meta = std::fs::metadata(dir)
        .map_err(|e| format!("cannot read volume {volume_id} on its node: {e}"))?;
    let target = SftpTarget {
        root_of: None,
        chroot: Some(dir.to_owned()),
        user: Some((meta.uid(), meta.gid())),
        home: "/".to_owned(),
    };
    super::session::spawn_sftp(helper, volume_id, &target.args(), &[]).map_err(|e| match e {
        super::EntryError::Io { source, .. } => {
            format!("cannot serve volume {volume_id}'s files on its node: {source}")
        }
        other => other.to_string(),
    })
}
