//! Entering a running instance: where it is (its namespaces, cgroup, uid, home and
//! environment) for a shell, a command, SFTP or port forwarding.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::procfs::{process_environment, process_start, process_uid};
use super::{InstanceFile, ProcessExecutor};
use crate::entry::sftp::SftpTarget;
use crate::entry::{session, tcp, Entered, EntryError, EntryKind, EntryRequest, LocalTarget};
use crate::executor::sandbox;

/// How long a session waits for a just-started instance's workload to take its uid: bwrap and
/// pasta set it up in well under a second, but a loaded node can take many.
const STARTING_WAIT: Duration = Duration::from_secs(30);

/// What a session finds of an instance.
enum Lookup {
    Running(LocalTarget),
    /// Started, but its workload has not yet dropped to the instance's uid (bwrap is still
    /// setting it up): a moment later it runs.
    Starting,
    Gone,
}

impl ProcessExecutor {
    /// Where a running instance is, for a session.
    fn entry_target(&self, id: &str) -> Lookup {
        // A reservation id names a directory of ours: nothing else.
        if id.is_empty() || id.starts_with('.') || id.contains(['/', '\0']) {
            return Lookup::Gone;
        }
        let Some(file) = std::fs::read(self.instance_dir(id).join("instance.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<InstanceFile>(&b).ok())
        else {
            tracing::debug!(reservation_id = %id, "entry: no instance.json for it");
            return Lookup::Gone;
        };
        if let Some(code) = self.exit_code(id) {
            tracing::info!(reservation_id = %id, code, "entry: the instance has ended");
            return Lookup::Gone;
        }
        if !self.group_alive(&file) {
            tracing::info!(reservation_id = %id, "entry: nothing of the instance runs");
            return Lookup::Gone;
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
                let Some(pid) = cg
                    .pids(id)
                    .into_iter()
                    .filter(|&p| process_uid(p) == Some(uid))
                    .min_by_key(|&p| process_start(p).unwrap_or(u64::MAX))
                else {
                    return Lookup::Starting;
                };
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
        Lookup::Running(LocalTarget {
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
        let deadline = Instant::now() + STARTING_WAIT;
        let target = loop {
            match self.entry_target(id) {
                Lookup::Running(target) => break target,
                Lookup::Starting if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Lookup::Starting => {
                    return Err(EntryError::StillStarting {
                        reservation_id: id.to_owned(),
                        waited_s: STARTING_WAIT.as_secs(),
                    })
                }
                Lookup::Gone => {
                    return Err(EntryError::NotRunning {
                        reservation_id: id.to_owned(),
                    })
                }
            }
        };
        match &request.kind {
            // In the workload's network namespace: its own, or the node's for an instance
            // that shares it (isolated); the agent's for an unisolated one.
            EntryKind::Tcp { port } => tcp::connect(id, *port, target.namespaces_of).await,
            EntryKind::Sftp => {
                let sftp = SftpTarget {
                    chroot: None,
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
