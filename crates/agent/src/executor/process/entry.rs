//! Entering a running instance: where it is (its namespaces, cgroup, uid, home and
//! environment) for a shell, a command, SFTP or port forwarding.

use std::path::PathBuf;

use super::procfs::{process_environment, process_start, process_uid};
use super::{InstanceFile, ProcessExecutor};
use crate::entry::sftp::SftpTarget;
use crate::entry::{session, tcp, Entered, EntryError, EntryKind, EntryRequest, LocalTarget};
use crate::executor::sandbox;

impl ProcessExecutor {
    /// Where a running instance is, for a session: None when it is not running.
    fn entry_target(&self, id: &str) -> Option<LocalTarget> {
        // A reservation id names a directory of ours: nothing else.
        if id.is_empty() || id.starts_with('.') || id.contains(['/', '\0']) {
            return None;
        }
        let file: InstanceFile = std::fs::read(self.instance_dir(id).join("instance.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())?;
        if self.exit_code(id).is_some() || !self.group_alive(&file) {
            return None;
        }
        let procs: Vec<PathBuf> = self
            .cgroup
            .as_ref()
            .map(|cg| {
                cg.instance(id)
                    .into_iter()
                    .map(|d| d.join("cgroup.procs"))
                    .collect()
            })
            .unwrap_or_default();
        let (namespaces_of, env_of, home, user) = match (file.uid, &self.cgroup) {
            (Some(uid), Some(cg)) => {
                // The workload: the oldest of the instance's processes that run as its uid
                // (the wrapper and bwrap are the agent's).
                let pid = cg
                    .pids(id)
                    .into_iter()
                    .filter(|&p| process_uid(p) == Some(uid))
                    .min_by_key(|&p| process_start(p).unwrap_or(u64::MAX))?;
                (
                    Some(pid),
                    pid,
                    PathBuf::from(sandbox::HOME),
                    Some((uid, uid)),
                )
            }
            // Unisolated: the wrapper shell has the instance's environment.
            _ => (None, file.pgid, self.home_path(id), None),
        };
        Some(LocalTarget {
            reservation_id: id.to_owned(),
            namespaces_of,
            procs,
            user,
            home,
            env: process_environment(env_of),
            shell: "/bin/sh".to_owned(),
        })
    }

    pub(super) async fn enter_instance(
        &self,
        id: &str,
        request: EntryRequest,
    ) -> Result<Entered, EntryError> {
        let target = self
            .entry_target(id)
            .ok_or_else(|| EntryError::NotRunning {
                reservation_id: id.to_owned(),
            })?;
        match &request.kind {
            // In the workload's network namespace: its own, or the node's for an instance
            // that shares it (isolated); the agent's for an unisolated one.
            EntryKind::Tcp { port } => tcp::connect(id, *port, target.namespaces_of).await,
            EntryKind::Sftp => {
                let sftp = SftpTarget {
                    root_of: target.namespaces_of,
                    user: target.user,
                    home: target.home.to_string_lossy().into_owned(),
                };
                session::spawn_sftp(&self.entry_helper, id, &sftp.args(), &target.procs)
            }
            EntryKind::Shell | EntryKind::Exec { .. } => session::spawn(&target, &request),
        }
    }
}
