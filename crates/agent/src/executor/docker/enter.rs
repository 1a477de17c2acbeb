//! Entering a running container: a shell or a command by `docker exec`, port forwarding and
//! SFTP inside its namespaces (as root only), as the container's own user.

use bollard::query_parameters::InspectContainerOptions;

use super::{container_name, is_not_found, DockerExecutor};
use crate::entry::root::{self, PasswdEntry};
use crate::entry::sftp::SftpTarget;
use crate::entry::{
    docker_exec, session, session_env, split_words, tcp, Entered, EntryError, EntryKind,
    EntryRequest,
};

impl DockerExecutor {
    pub(super) async fn enter_container(
        &self,
        id: &str,
        request: EntryRequest,
    ) -> Result<Entered, EntryError> {
        let name = container_name(id);
        let not_running = || EntryError::NotRunning {
            reservation_id: id.to_owned(),
        };
        let inspect = match self
            .docker
            .inspect_container(&name, None::<InspectContainerOptions>)
            .await
        {
            Ok(inspect) => inspect,
            Err(e) if is_not_found(&e) => return Err(not_running()),
            Err(e) => {
                return Err(EntryError::Engine {
                    action: "find the container",
                    reservation_id: id.to_owned(),
                    message: e.to_string(),
                })
            }
        };
        let state = inspect.state.unwrap_or_default();
        let pid = state
            .pid
            .and_then(|p| i32::try_from(p).ok())
            .filter(|&p| p > 0 && state.running == Some(true))
            .ok_or_else(not_running)?;
        let config = inspect.config.unwrap_or_default();
        let user = config.user.unwrap_or_default();
        if matches!(request.kind, EntryKind::Tcp { .. } | EntryKind::Sftp)
            && !crate::executor::sandbox::running_as_root()
        {
            return Err(EntryError::Unsupported {
                what: if request.kind == EntryKind::Sftp {
                    "SFTP"
                } else {
                    "port forwarding"
                },
                reservation_id: id.to_owned(),
                why: "the node's agent does not run as root, which joining a container's namespaces needs".into(),
            });
        }
        match &request.kind {
            EntryKind::Tcp { port } => tcp::connect(id, *port, Some(pid)).await,
            EntryKind::Sftp => {
                let (uid, gid, home) = container_user(pid, &user, config.working_dir.as_deref())
                    .ok_or_else(|| EntryError::Unsupported {
                        what: "SFTP",
                        reservation_id: id.to_owned(),
                        why: format!("the container's user {user:?} is not in its /etc/passwd"),
                    })?;
                let sftp = SftpTarget {
                    chroot: None,
                    root_of: Some(pid),
                    user: Some((uid, gid)),
                    home,
                };
                session::spawn_sftp(&self.entry_helper, id, &sftp.args(), &[])
            }
            EntryKind::Shell | EntryKind::Exec { .. } => {
                let account = user.split(':').next().unwrap_or_default();
                let entry = root::passwd_entry(pid, if account.is_empty() { "0" } else { account });
                let shell = root::login_shell(pid, entry.as_ref());
                let cmd = match (&request.kind, shell) {
                    (EntryKind::Exec { command }, Some(shell)) => {
                        vec![shell, "-c".to_owned(), command.clone()]
                    }
                    (EntryKind::Exec { command }, None) => split_words(command),
                    (_, Some(shell)) => vec![shell, "-l".to_owned()],
                    (_, None) => {
                        return Err(EntryError::NoShell {
                            reservation_id: id.to_owned(),
                        })
                    }
                };
                if cmd.is_empty() {
                    return Err(EntryError::EmptyCommand {
                        reservation_id: id.to_owned(),
                    });
                }
                // The container's own variables come with the exec; only what the client
                // adds goes in the request.
                let own: Vec<(std::ffi::OsString, std::ffi::OsString)> = config
                    .env
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect();
                let added: Vec<String> = session_env(&own, &request)
                    .into_iter()
                    .filter(|pair| !own.contains(pair))
                    .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
                    .collect();
                docker_exec::exec(
                    &self.docker,
                    id,
                    &name,
                    cmd,
                    &user,
                    added,
                    request.pty.as_ref(),
                )
                .await
            }
        }
    }
}

/// (uid, gid, home) of a container's user (`Config.User`: empty for root, a name or a uid,
/// with `:group` perhaps), names from the container's `/etc/passwd`.
fn container_user(pid: i32, user: &str, working_dir: Option<&str>) -> Option<(u32, u32, String)> {
    let (account, group) = match user.split_once(':') {
        Some((a, g)) => (a, Some(g)),
        None => (user, None),
    };
    let account = if account.is_empty() { "0" } else { account };
    let entry: Option<PasswdEntry> = root::passwd_entry(pid, account);
    let uid = match (&entry, account.parse::<u32>()) {
        (Some(e), _) => e.uid,
        (None, Ok(uid)) => uid,
        (None, Err(_)) => return None,
    };
    let gid = match group.map(str::parse::<u32>) {
        Some(Ok(gid)) => gid,
        _ => entry.as_ref().map_or(uid, |e| e.gid),
    };
    let home = entry
        .map(|e| e.home)
        .filter(|h| h.starts_with('/'))
        .or_else(|| {
            working_dir
                .filter(|w| w.starts_with('/'))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "/".to_owned());
    Some((uid, gid, home))
}
