//! A session as a process of the node, put into the instance by [`Confinement`]: the
//! process executor's shells and commands, and the SFTP helper of both executors.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;

use async_trait::async_trait;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;

use super::confine::Confinement;
use super::pty::{self, Master};
use super::{
    session_env, CloseOnShutdown, Entered, EntryControl, EntryError, EntryKind, EntryRequest,
    ExitStatus, Input, Output,
};
use crate::executor::process_uid;

/// Where an instance runs on the node, as the process executor found it.
#[derive(Debug, Clone)]
pub struct LocalTarget {
    pub reservation_id: String,
    /// A process of the instance whose namespaces and root a session joins (None: the
    /// node's, for an unisolated instance).
    pub namespaces_of: Option<i32>,
    /// The instance's `cgroup.procs` files.
    pub procs: Vec<PathBuf>,
    /// (uid, gid) of the instance; None: the agent's user.
    pub user: Option<(u32, u32)>,
    /// Its working directory and `HOME`, as the session sees it.
    pub home: PathBuf,
    /// Its environment.
    pub env: Vec<(OsString, OsString)>,
    /// The login shell.
    pub shell: String,
}

/// Starts the argv of a shell or exec request in the target.
pub fn spawn(target: &LocalTarget, request: &EntryRequest) -> Result<Entered, EntryError> {
    let id = &target.reservation_id;
    let argv: Vec<String> = match &request.kind {
        EntryKind::Shell => vec![target.shell.clone(), "-l".into()],
        EntryKind::Exec { command } => vec![target.shell.clone(), "-c".into(), command.clone()],
        EntryKind::Sftp | EntryKind::Tcp { .. } => {
            return Err(EntryError::Unsupported {
                what: "this kind of session",
                reservation_id: id.clone(),
                why: "only a shell or a command runs as a process session".into(),
            })
        }
    };
    let env = session_env(&target.env, request);
    let fail = |action, e| EntryError::io(action, id, e);
    let (pid_read, pid_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| fail("start a session", e.into()))?;
    let master_slave = match &request.pty {
        Some(p) => {
            let (master, slave) = pty::open(p).map_err(|e| fail("open a terminal", e))?;
            // The terminal is the session user's, as sshd makes it (mesg, script, tty).
            if let Some((uid, gid)) = target.user {
                nix::unistd::fchown(&slave, Some(uid.into()), Some(gid.into()))
                    .map_err(|e| fail("open a terminal", e.into()))?;
            }
            Some((master, slave))
        }
        None => None,
    };
    let confinement = Confinement::prepare(
        target.namespaces_of,
        &target.procs,
        &target.home,
        target.user,
        master_slave.is_some(),
        Some(pid_write),
    )
    .map_err(|e| fail("join the instance", e))?;
    // The namespaces were opened by pid: were it reused by another process meanwhile, it
    // would not run as the instance's uid.
    if let (Some(pid), Some((uid, _))) = (target.namespaces_of, target.user) {
        if process_uid(pid) != Some(uid) {
            return Err(EntryError::NotRunning {
                reservation_id: id.clone(),
            });
        }
    }
    let forks = confinement.forks();
    let mut command = tokio::process::Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env_clear()
        .envs(env)
        .kill_on_drop(false);
    let mut master = None;
    match master_slave {
        Some((m, slave)) => {
            let clone = |fd: &OwnedFd| fd.try_clone().map_err(|e| fail("open a terminal", e));
            command
                .stdin(Stdio::from(clone(&slave)?))
                .stdout(Stdio::from(clone(&slave)?))
                .stderr(Stdio::from(slave));
            master = Some(m);
        }
        None => {
            command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
    }
    // SAFETY: `apply` makes only async-signal-safe system calls on what `prepare` opened.
    unsafe {
        command.pre_exec(move || confinement.apply());
    }
    let spawned = command.spawn();
    // The closure holds the pipe's write end: gone, a read of it ends.
    drop(command);
    let reported = || {
        let mut bytes = [0u8; 4];
        match nix::unistd::read(&pid_read, &mut bytes) {
            Ok(4) => Some(i32::from_ne_bytes(bytes)),
            _ => None,
        }
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            // A session's process whose exec failed is the agent's child: reaped here.
            if let Some(pid) = forks.then(reported).flatten() {
                std::thread::spawn(move || reap(pid, true));
            }
            return Err(if e.kind() == std::io::ErrorKind::NotFound {
                EntryError::NoShell {
                    reservation_id: id.clone(),
                }
            } else {
                fail("start a session", e)
            });
        }
    };
    // Joining a PID namespace, the spawned child made the session's process (the agent's
    // child too) and wrote its pid before it ended, which `spawn` waited for.
    let taken = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let process = if forks {
        let Some(pid) = reported() else {
            return Err(fail(
                "start a session",
                std::io::Error::other("the session's process did not report its pid"),
            ));
        };
        // The spawned child is done; tokio reaps it.
        drop(child);
        Process::adopt(pid).map_err(|e| fail("start a session", e))?
    } else {
        Process::Spawned(child)
    };
    let (stdin, stdout, stderr): (Input, Output, Option<Output>) = match &master {
        Some(m) => {
            let dup = || {
                m.try_clone()
                    .and_then(Master::new)
                    .map_err(|e| fail("open a terminal", e))
            };
            (Box::new(dup()?), Box::new(dup()?), None)
        }
        None => {
            let (Some(i), Some(o), Some(e)) = taken else {
                return Err(fail("start a session", std::io::Error::other("no pipes")));
            };
            (CloseOnShutdown::boxed(i), Box::new(o), Some(Box::new(e)))
        }
    };
    Ok(Entered {
        stdin,
        stdout,
        stderr,
        control: Box::new(ProcessControl {
            reservation_id: id.clone(),
            process,
            master,
            ended: false,
        }),
    })
}

/// Runs the SFTP helper for the target: `HELPER instance-sftp ARGS`, which confines itself,
/// in the instance's cgroup (`procs`) where it has one, so that its limits hold and a stop
/// ends it.
pub fn spawn_sftp(
    helper: &std::path::Path,
    reservation_id: &str,
    args: &[String],
    procs: &[PathBuf],
) -> Result<Entered, EntryError> {
    let fail = |e: std::io::Error| {
        EntryError::io(
            "start the SFTP server",
            reservation_id,
            std::io::Error::new(e.kind(), format!("{}: {e}", helper.display())),
        )
    };
    let confinement =
        Confinement::prepare(None, procs, std::path::Path::new("/"), None, false, None)
            .map_err(fail)?;
    let mut command = tokio::process::Command::new(helper);
    command
        .arg("instance-sftp")
        .args(args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    // SAFETY: `apply` makes only async-signal-safe system calls on what `prepare` opened.
    unsafe {
        command.pre_exec(move || confinement.apply());
    }
    let mut child = command.spawn().map_err(fail)?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(EntryError::io(
            "start the SFTP server",
            reservation_id,
            std::io::Error::other("no pipes"),
        ));
    };
    Ok(Entered {
        stdin: CloseOnShutdown::boxed(stdin),
        stdout: Box::new(stdout),
        stderr: None,
        control: Box::new(ProcessControl {
            reservation_id: reservation_id.to_owned(),
            process: Process::Spawned(child),
            master: None,
            ended: false,
        }),
    })
}

/// A session's process: the one the agent spawned, or one that joined a PID namespace,
/// which a child the agent spawned made (its parent is the agent all the same).
enum Process {
    Spawned(tokio::process::Child),
    Adopted {
        pid: i32,
        /// Readable once it has ended (None where the kernel has no pidfd: a blocking wait).
        pidfd: Option<AsyncFd<OwnedFd>>,
    },
}

impl Process {
    fn adopt(pid: i32) -> std::io::Result<Self> {
        // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = match i32::try_from(fd) {
            Ok(fd) if fd >= 0 => {
                // SAFETY: a descriptor the kernel just returned, owned by nothing else.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                // SAFETY: the OwnedFd stays open and the same while the AsyncFd owns it.
                Some(unsafe { AsyncFd::register(owned) }.map_err(std::io::Error::from)?)
            }
            _ => None,
        };
        Ok(Process::Adopted { pid, pidfd })
    }

    fn pid(&self) -> i32 {
        match self {
            Process::Spawned(child) => child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0),
            Process::Adopted { pid, .. } => *pid,
        }
    }
}

/// How an adopted process ended, once it has (it is the agent's child: reaped here).
fn reap(pid: i32, block: bool) -> std::io::Result<Option<ExitStatus>> {
    let flags = (!block).then_some(WaitPidFlag::WNOHANG);
    loop {
        return match waitpid(Pid::from_raw(pid), flags) {
            Ok(WaitStatus::Exited(_, code)) => {
                Ok(Some(ExitStatus::Code(u32::try_from(code).unwrap_or(255))))
            }
            Ok(WaitStatus::Signaled(_, signal, core_dumped)) => Ok(Some(ExitStatus::Signal {
                name: super::signal_name(signal as i32),
                core_dumped,
            })),
            Ok(WaitStatus::StillAlive) => Ok(None),
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => Err(e.into()),
        };
    }
}

struct ProcessControl {
    reservation_id: String,
    process: Process,
    master: Option<OwnedFd>,
    /// Reaped: its pid may belong to another process now.
    ended: bool,
}

#[async_trait]
impl EntryControl for ProcessControl {
    async fn resize(&self, cols: u16, rows: u16) -> Result<(), EntryError> {
        match &self.master {
            Some(m) => pty::resize(m, cols, rows)
                .map_err(|e| EntryError::io("resize the terminal", &self.reservation_id, e)),
            None => Ok(()),
        }
    }

    async fn signal(&self, name: &str) -> Result<(), EntryError> {
        let signal = super::parse_signal(name)?;
        let pid = self.process.pid();
        if self.ended || pid <= 0 {
            return Ok(());
        }
        // Unreaped, the pid is still the session's (a zombie at worst).
        match kill(Pid::from_raw(pid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(EntryError::io(
                "send a signal",
                &self.reservation_id,
                e.into(),
            )),
        }
    }

    async fn wait(&mut self) -> Result<ExitStatus, EntryError> {
        let fail = |e| EntryError::io("wait for the session", &self.reservation_id, e);
        let status = match &mut self.process {
            Process::Spawned(child) => child.wait().await.map_err(fail)?.into(),
            Process::Adopted {
                pid,
                pidfd: Some(fd),
            } => loop {
                let mut ready = fd.readable().await.map_err(fail)?;
                match reap(*pid, false).map_err(fail)? {
                    Some(status) => break status,
                    None => ready.clear_ready(),
                }
            },
            Process::Adopted { pid, pidfd: None } => {
                let pid = *pid;
                tokio::task::spawn_blocking(move || reap(pid, true))
                    .await
                    .map_err(|e| fail(std::io::Error::other(e)))?
                    .map_err(fail)?
                    .unwrap_or(ExitStatus::Code(255))
            }
        };
        self.ended = true;
        Ok(status)
    }
}

impl Drop for ProcessControl {
    /// A session given up (its channel closed) ends: its process group is killed (and an
    /// adopted process reaped, so it leaves no zombie).
    fn drop(&mut self) {
        let pid = self.process.pid();
        if self.ended || pid <= 0 {
            return;
        }
        match &mut self.process {
            Process::Spawned(child) => {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = child.start_kill();
            }
            Process::Adopted { .. } => {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                std::thread::spawn(move || reap(pid, true));
            }
        }
    }
}
