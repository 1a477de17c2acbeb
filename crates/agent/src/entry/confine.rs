//! Putting a session's process where the instance runs: into its cgroup, its namespaces and
//! its root, then down to its uid with no groups, no capabilities and `no_new_privs`.
//!
//! [`Confinement::apply`] runs in the child between fork and exec (a `pre_exec` hook) of
//! the multi-threaded agent, so it makes only async-signal-safe system calls on what
//! [`Confinement::prepare`] opened before the fork: no allocation, no lock. The environment
//! is the exec's own (`envp`), so no root program ever runs with the tenant's variables
//! (an `LD_PRELOAD` of theirs, say).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The namespaces a session joins, the mount namespace last (after it, `/proc` is the
/// instance's). The network's is the instance's own, or the node's where it shares it.
const NAMESPACES: [(&str, libc::c_int); 5] = [
    ("net", libc::CLONE_NEWNET),
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
    ("pid", libc::CLONE_NEWPID),
    ("mnt", libc::CLONE_NEWNS),
];

/// Where and as whom a session's process runs, opened before the fork.
#[derive(Debug)]
pub struct Confinement {
    /// `cgroup.procs` files, opened for writing.
    procs: Vec<OwnedFd>,
    /// The target's namespaces, in the order of `NAMESPACES`.
    namespaces: Vec<(OwnedFd, libc::c_int)>,
    /// The target's root directory, to chroot to once in its mount namespace.
    root: Option<OwnedFd>,
    cwd: CString,
    /// (uid, gid) to drop to; None: stay the agent's user.
    user: Option<(u32, u32)>,
    /// The session's stdin is a PTY's slave: make it the controlling terminal.
    controlling_tty: bool,
    /// Where the first child writes the pid of the session's process (its sibling, the
    /// agent's child) when it joins a PID namespace: 4 bytes in native order.
    pid_report: Option<OwnedFd>,
}

fn open_path(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(flags & libc::O_WRONLY == 0)
        .write(flags & libc::O_WRONLY != 0)
        .custom_flags(flags & !libc::O_WRONLY)
        .open(path)?;
    Ok(OwnedFd::from(file))
}

use std::os::unix::fs::OpenOptionsExt;

impl Confinement {
    /// `target`: a process of the instance whose namespaces and root the session joins
    /// (None: the node's, as an unisolated instance has). `procs`: the instance's
    /// `cgroup.procs` files. `pid_report`: the write end of a pipe (see the field).
    pub fn prepare(
        target: Option<i32>,
        procs: &[std::path::PathBuf],
        cwd: &Path,
        user: Option<(u32, u32)>,
        controlling_tty: bool,
        pid_report: Option<OwnedFd>,
    ) -> io::Result<Self> {
        let procs = procs
            .iter()
            .map(|p| open_path(p, libc::O_WRONLY | libc::O_CLOEXEC))
            .collect::<io::Result<Vec<_>>>()?;
        let mut namespaces = Vec::new();
        let mut root = None;
        if let Some(pid) = target {
            let ns = Path::new("/proc").join(pid.to_string()).join("ns");
            for (name, flag) in NAMESPACES {
                let fd = open_path(&ns.join(name), libc::O_RDONLY | libc::O_CLOEXEC)?;
                namespaces.push((fd, flag));
            }
            root = Some(open_path(
                &Path::new("/proc").join(pid.to_string()).join("root"),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )?);
        }
        let cwd = CString::new(cwd.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
        Ok(Confinement {
            procs,
            namespaces,
            root,
            cwd,
            user,
            controlling_tty,
            pid_report,
        })
    }

    /// Whether the session joins the instance's PID namespace (and so is not the process
    /// the agent spawned but one that process made).
    pub fn forks(&self) -> bool {
        self.namespaces
            .iter()
            .any(|(_, f)| *f == libc::CLONE_NEWPID)
    }

    /// In the child between fork and exec: joins the cgroup and namespaces, makes the
    /// session's process when a PID namespace was joined (and ends, never returning), which
    /// starts a session of its own and confines itself to the instance's root, working
    /// directory and user.
    pub fn apply(&self) -> io::Result<()> {
        for fd in &self.procs {
            // "0" moves the writing process.
            // SAFETY: writes 1 byte from a static buffer to an open descriptor.
            if unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) } != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: setsid has no memory effects; a fresh child is never a group leader. The
        // session leaves the agent's, so the agent's terminal's signals miss it.
        unsafe { libc::setsid() };
        for (fd, flag) in &self.namespaces {
            // SAFETY: a system call on an open namespace descriptor.
            if unsafe { libc::setns(fd.as_raw_fd(), *flag) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if self.forks() {
            // Joining a PID namespace takes effect for children only: the session's process
            // is a child made here, with the agent as its parent (CLONE_PARENT), so that
            // nothing stays behind to wait for it; this child reports its pid and ends.
            let flags = (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong;
            // SAFETY: a fork-like clone (no new stack: the child gets a copy of this one) of
            // the single-threaded child of a fork; both sides make only async-signal-safe
            // calls until exec or _exit.
            match unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) } {
                -1 => return Err(io::Error::last_os_error()),
                0 => {
                    // SAFETY: as above; the new process leads no group.
                    unsafe { libc::setsid() };
                }
                child => report_and_exit(child, self.pid_report.as_ref()),
            }
        }
        if self.controlling_tty {
            // SAFETY: an ioctl without memory arguments on stdin (the PTY's slave).
            if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(root) = &self.root {
            // SAFETY: system calls on an open descriptor and a static C string.
            unsafe {
                if libc::fchdir(root.as_raw_fd()) != 0 || libc::chroot(c".".as_ptr()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        // SAFETY: chdir with C strings that live as long as self.
        unsafe {
            if libc::chdir(self.cwd.as_ptr()) != 0 {
                libc::chdir(c"/".as_ptr());
            }
        }
        if let Some((uid, gid)) = self.user {
            drop_privileges(uid, gid)?;
        }
        Ok(())
    }
}

/// The first child, once the session's process exists: reports its pid and ends.
fn report_and_exit(child: libc::c_long, report: Option<&OwnedFd>) -> ! {
    let pid = libc::pid_t::try_from(child).unwrap_or(0);
    // SAFETY: a write from a stack buffer and _exit, both async-signal-safe.
    unsafe {
        if let Some(fd) = report {
            let bytes = pid.to_ne_bytes();
            libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
        }
        libc::_exit(0)
    }
}

/// Becomes `uid`:`gid` with no supplementary groups, an empty bounding set, no
/// capabilities at all (also as uid 0: a container's root without capabilities stays so)
/// and `no_new_privs`. Async-signal-safe.
pub fn drop_privileges(uid: u32, gid: u32) -> io::Result<()> {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let fail = || Err(io::Error::last_os_error());
    // SAFETY: system calls with integer arguments and pointers to live stack values.
    unsafe {
        // The bounding set needs CAP_SETPCAP, so before the uid changes.
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                if *libc::__errno_location() == libc::EINVAL {
                    break;
                }
                return fail();
            }
        }
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(gid, gid, gid) != 0
            || libc::setresuid(uid, uid, uid) != 0
        {
            return fail();
        }
        let header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
            return fail();
        }
        // Ambient capabilities went with the permitted ones; older kernels lack the call.
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return fail();
        }
    }
    Ok(())
}

/// Joins the mount namespace and root of process `pid` (for the SFTP helper, which is
/// single-threaded when it calls this: joining a mount namespace needs that).
pub fn enter_root_of(pid: i32) -> io::Result<()> {
    let proc = Path::new("/proc").join(pid.to_string());
    let ns = open_path(&proc.join("ns/mnt"), libc::O_RDONLY | libc::O_CLOEXEC)?;
    let root = open_path(
        &proc.join("root"),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    )?;
    // SAFETY: system calls on open descriptors and a static C string.
    unsafe {
        if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) != 0
            || libc::fchdir(root.as_raw_fd()) != 0
            || libc::chroot(c".".as_ptr()) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes `dir` the root and the working directory (for the SFTP helper serving a volume with
/// no instance: every path and symlink then resolves inside the volume). Needs
/// CAP_SYS_CHROOT; the caller drops it (`drop_privileges`) before serving, so that the root
/// cannot be left again.
pub fn chroot_into(dir: &Path) -> io::Result<()> {
    let root = open_path(dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)?;
    // SAFETY: system calls on an open descriptor and static C strings.
    unsafe {
        if libc::fchdir(root.as_raw_fd()) != 0
            || libc::chroot(c".".as_ptr()) != 0
            || libc::chdir(c"/".as_ptr()) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Joins the PID namespace of process `pid` and forks: returns in the child, which is in
/// that namespace (so it ends with the instance: its init's death kills every member) and
/// dies with its parent; the parent waits for it and exits as it exited. For the SFTP
/// helper, which calls it while single-threaded.
pub fn fork_into_pid_namespace_of(pid: i32) -> io::Result<()> {
    let ns = open_path(
        &Path::new("/proc").join(pid.to_string()).join("ns/pid"),
        libc::O_RDONLY | libc::O_CLOEXEC,
    )?;
    // SAFETY: a system call on an open namespace descriptor.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
        return Err(io::Error::last_os_error());
    }
    drop(ns);
    // SAFETY: getpid has no memory effects.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the caller is single-threaded, so the child may run any code.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // SAFETY: system calls with integer arguments.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                // The parent may have died before the death signal was set: then the
                // namespace's init (or a reaper) is the parent. A parent outside the
                // namespace shows as 0.
                let ppid = libc::getppid();
                if ppid != 0 && ppid != parent {
                    libc::_exit(1);
                }
            }
            Ok(())
        }
        child => {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid writes one int that lives on the stack.
            while unsafe { libc::waitpid(child, &mut status, 0) } == -1 {
                if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    std::process::exit(255);
                }
            }
            if libc::WIFSIGNALED(status) {
                let signal = libc::WTERMSIG(status);
                // SAFETY: resets a disposition and signals this process.
                unsafe {
                    libc::signal(signal, libc::SIG_DFL);
                    libc::kill(libc::getpid(), signal);
                }
            }
            std::process::exit(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                255
            })
        }
    }
}
