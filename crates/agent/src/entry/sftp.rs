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
