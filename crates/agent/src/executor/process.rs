//! The process executor, for hosts without Docker: the reservation's command runs isolated
//! (`sandbox`: a uid of its own, its own mount and PID namespaces, `no_new_privs`) in a cgroup
//! with CPU, memory and pids limits (`cgroup`: v2, or v1 where only v1 exists), with
//! `CUDA_VISIBLE_DEVICES` set to its GPUs' UUIDs. A host where that cannot be set up refuses
//! it, unless its owner allows unisolated instances (then they run as the agent's user).
//!
//! Each instance has a directory under the agent's data dir (`instances/<reservation>/`, the
//! agent's only) with its identity (`instance.json`), its output (`output.log`), once it ends
//! by itself its exit code (`exit_code`, written by the wrapper shell, outside the sandbox),
//! and, isolated, the instance's own directory (`home/`, owned by its uid: the sandbox's
//! `/instance`).
//! A stop removes that directory but keeps the output, as `instances/<reservation>.<epoch>.log`
//! (the agent's, never the tenant's uid's), until the agent has shipped it (`forget_output`).
//! A restarted agent adopts instances from these directories: nothing runs twice and nothing
//! is orphaned.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use gpurent_types::agent::Assignment;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::cgroup::{CgroupLimits, CgroupRoot};
use super::limits::GpuLimits;
use super::resources::ResourcesPerGpu;
use super::sandbox::{self, Sandbox};
use super::{is_reserved_env, Executor};
use crate::entry::sftp::SftpTarget;
use crate::entry::{session, tcp, Entered, EntryError, EntryKind, EntryRequest, LocalTarget};
use crate::reconcile::{Observed, ObservedState};
use crate::AgentError;

/// The default first uid of the range instances run as (`--instance-uid-base`): above the
/// ranges distributions and `/etc/subuid` usually hand out (100000 + 65536).
pub const DEFAULT_INSTANCE_UID_BASE: u32 = 200_000;

/// How the process executor isolates instances.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// The cgroup v2 directory instances' cgroups go under; where only cgroup v1 exists, its
    /// name under each of the memory, cpu and pids hierarchies.
    pub cgroup_root: PathBuf,
    /// Instances run as uids from here on, one each (`sandbox::UID_RANGE` of them).
    pub uid_base: u32,
    /// Where isolation cannot be set up, run instances unisolated (with a warning) instead of
    /// refusing to start.
    pub allow_unisolated: bool,
    /// Directories of the node an instance must never see besides the agent's data dir (the
    /// control plane's data dir under `up`, the checkpoint volumes' root): where one lies under
    /// a system directory the sandbox shows (`/etc`, `/opt`, `/usr`), it is covered.
    pub hidden: Vec<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct InstanceFile {
    reservation_id: String,
    epoch: i64,
    /// The process group, led by the wrapper shell.
    pgid: i32,
    /// The uid its command runs as; None when it runs unisolated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uid: Option<u32>,
}

/// Joins the instance's cgroups (the first `$1` arguments: `cgroup.procs` files), runs the
/// rest of its arguments (after the exit code file, `mv` and whether fd 3 gets the sandbox's
/// options from stdin) and records its exit code. It runs outside the sandbox, as the agent's
/// user, with the agent's environment: no tool it runs is found through the tenant's `PATH`.
const WRAPPER: &str = r#"n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done
ex=$1; mv=$2; feed=$3; shift 3
if [ "$feed" = 1 ]; then "$@" 3<&0 </dev/null; else "$@"; fi
code=$?
echo $code > "$ex.tmp" && "$mv" "$ex.tmp" "$ex"
exit $code"#;

#[derive(Debug)]
pub struct ProcessExecutor {
    dir: PathBuf,
    cgroup: Option<CgroupRoot>,
    /// None: instances run unisolated, as the agent's user.
    sandbox: Option<Sandbox>,
    mv: PathBuf,
    resources: ResourcesPerGpu,
    grace: Duration,
    /// Instances this agent started: waited on so they do not linger as zombies.
    children: Mutex<HashMap<String, tokio::process::Child>>,
    /// Serialises uid choice between concurrent starts.
    uid_lock: tokio::sync::Mutex<()>,
    /// The binary whose `instance-sftp` serves SFTP sessions.
    entry_helper: PathBuf,
    /// What instances are told of their GPU memory.
    gpu_limits: GpuLimits,
}

fn exec_error(action: &'static str, id: &str, e: impl std::fmt::Display) -> AgentError {
    AgentError::Executor {
        executor: "process",
        action,
        reservation_id: id.to_owned(),
        message: e.to_string(),
    }
}

impl ProcessExecutor {
    /// Isolated instances, or an error saying why this host cannot isolate them (unless
    /// `allow_unisolated`, which falls back to `unisolated` with a warning).
    pub fn isolated(
        data_dir: &Path,
        isolation: &Isolation,
        resources: ResourcesPerGpu,
    ) -> Result<Self, AgentError> {
        let mut executor = Self::build(data_dir, resources)?;
        let setup = CgroupRoot::prepare(&isolation.cgroup_root)
            .map_err(|why| {
                format!(
                    "no writable cgroup tree for the limits at {}: {why}",
                    isolation.cgroup_root.display()
                )
            })
            .and_then(|cgroup| {
                let mut hidden = isolation.hidden.clone();
                hidden.push(data_dir.to_owned());
                let probe = executor.dir.join(".probe");
                Sandbox::probe(isolation.uid_base, hidden, &probe).map(|sb| (cgroup, sb))
            });
        match setup {
            Ok((cgroup, sandbox)) => {
                tracing::info!(
                    cgroup = %cgroup.describe(),
                    uids = ?sandbox.uids(),
                    "process executor isolates instances: a uid, mount and PID namespaces of their own"
                );
                executor.cgroup = Some(cgroup);
                executor.sandbox = Some(sandbox);
                Ok(executor)
            }
            Err(why) if isolation.allow_unisolated => {
                tracing::warn!(%why, "process executor runs instances UNISOLATED (--allow-unisolated): tenants can read this node's credentials and each other's work");
                executor.cgroup = match CgroupRoot::prepare(&isolation.cgroup_root) {
                    Ok(root) => Some(root),
                    Err(why) => {
                        tracing::warn!(%why, "process executor runs instances WITHOUT cpu, memory and pids limits");
                        None
                    }
                };
                Ok(executor)
            }
            Err(why) => Err(AgentError::Unisolated { why }),
        }
    }

    /// Unisolated instances, as the agent's user, in cgroups under `cgroup_root` when given
    /// and writable (tests, and hosts whose owner passed `--allow-unisolated`).
    pub fn unisolated(
        data_dir: &Path,
        cgroup_root: Option<&Path>,
        resources: ResourcesPerGpu,
    ) -> Result<Self, AgentError> {
        let mut executor = Self::build(data_dir, resources)?;
        executor.cgroup = match cgroup_root.map(CgroupRoot::prepare) {
            Some(Ok(root)) => {
                tracing::info!(cgroup = %root.describe(), "process executor confines instances in cgroups");
                Some(root)
            }
            Some(Err(why)) => {
                tracing::warn!(%why, "process executor runs instances WITHOUT cpu, memory and pids limits");
                None
            }
            None => None,
        };
        Ok(executor)
    }

    fn build(data_dir: &Path, resources: ResourcesPerGpu) -> Result<Self, AgentError> {
        let dir = data_dir.join("instances");
        std::fs::create_dir_all(&dir).map_err(|source| AgentError::Identity {
            path: dir.clone(),
            source,
        })?;
        set_mode(&dir, 0o700).map_err(|source| AgentError::Identity {
            path: dir.clone(),
            source,
        })?;
        Ok(ProcessExecutor {
            dir,
            cgroup: None,
            sandbox: None,
            mv: sandbox::system_tool("mv").unwrap_or_else(|| "/bin/mv".into()),
            resources,
            grace: Duration::from_secs(10),
            children: Mutex::new(HashMap::new()),
            uid_lock: tokio::sync::Mutex::new(()),
            entry_helper: crate::entry::sftp::default_helper(),
            gpu_limits: GpuLimits::default(),
        })
    }

    /// What instances are told of their GPU memory (`GPURENT_VRAM_LIMIT_MB`, MPS limits).
    pub fn with_gpu_limits(mut self, limits: GpuLimits) -> Self {
        self.gpu_limits = limits;
        self
    }

    /// How long a stopped instance gets between SIGTERM and SIGKILL when its assignment does
    /// not say.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The binary whose hidden `instance-sftp` subcommand serves SFTP sessions (by default
    /// the agent's own).
    pub fn with_entry_helper(mut self, helper: PathBuf) -> Self {
        self.entry_helper = helper;
        self
    }

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

    pub fn is_confined(&self) -> bool {
        self.cgroup.is_some()
    }

    pub fn is_isolated(&self) -> bool {
        self.sandbox.is_some()
    }

    /// The cgroup version instances are confined with, if any.
    pub fn cgroup_version(&self) -> Option<u8> {
        self.cgroup.as_ref().map(CgroupRoot::version)
    }

    fn instance_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// The instance's output, for logs.
    pub fn output_path(&self, id: &str) -> PathBuf {
        self.instance_dir(id).join("output.log")
    }

    /// Where a stop keeps the output of the instance of this epoch: beside the instance
    /// directories, outside what any instance sees.
    fn kept_path(&self, id: &str, epoch: i64) -> PathBuf {
        self.dir.join(format!("{id}.{epoch}.log"))
    }

    /// The outputs stops kept: (reservation, epoch, file).
    fn kept(&self) -> Vec<(String, i64, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let (id, epoch) = name.strip_suffix(".log")?.rsplit_once('.')?;
                Some((id.to_owned(), epoch.parse().ok()?, e.path()))
            })
            .collect()
    }

    /// The output of the reservation's instance: its live one, else the one its stop kept.
    fn output_file(&self, id: &str) -> std::io::Result<std::fs::File> {
        match std::fs::File::open(self.output_path(id)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match self.kept().into_iter().find(|(r, _, _)| r == id) {
                    Some((_, _, path)) => std::fs::File::open(path),
                    None => Err(e),
                }
            }
            other => other,
        }
    }

    /// Keeps the output of a stopped instance (its processes are all gone: none writes to it
    /// any more) outside its directory, in place of what an earlier stop kept.
    fn keep_output(&self, f: &InstanceFile) {
        let id = &f.reservation_id;
        let output = self.output_path(id);
        if !output.exists() {
            return;
        }
        for (_, _, path) in self.kept().into_iter().filter(|(r, _, _)| r == id) {
            let _ = std::fs::remove_file(path);
        }
        let kept = self.kept_path(id, f.epoch);
        // The agent's alone (it always was: the instance only ever had an open descriptor).
        if let Err(e) = std::fs::rename(&output, &kept).and_then(|()| set_mode(&kept, 0o600)) {
            tracing::warn!(reservation_id = %id, error = %e, "cannot keep the output of a stopped instance; what it wrote since the last sync is lost");
        }
    }

    /// The instance's own directory on the node: its working directory and `HOME`. Unisolated,
    /// the instance directory itself (as it always was).
    pub fn home_path(&self, id: &str) -> PathBuf {
        if self.sandbox.is_some() {
            self.instance_dir(id).join("home")
        } else {
            self.instance_dir(id)
        }
    }

    fn limits(&self, gpus: usize) -> CgroupLimits {
        let limits = self.resources.for_instance(gpus);
        CgroupLimits {
            milli_cpus: limits.milli_cpus,
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
        }
    }

    fn read_instances(&self) -> Vec<InstanceFile> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read(e.path().join("instance.json")).ok())
            .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
            .collect()
    }

    /// Whether anything of the instance still runs: its process group (the wrapper leads it
    /// from the start, before it has moved itself into the cgroup) or its cgroup (which also
    /// holds processes that left the group).
    fn group_alive(&self, f: &InstanceFile) -> bool {
        group_runs(f.pgid)
            || self.cgroup.as_ref().is_some_and(|cg| {
                cg.pids(&f.reservation_id)
                    .into_iter()
                    .any(|pid| process_state(pid).is_some_and(|s| s != 'Z'))
            })
    }

    /// The exit code the wrapper wrote once the workload ended by itself.
    fn exit_code(&self, id: &str) -> Option<i32> {
        std::fs::read_to_string(self.instance_dir(id).join("exit_code"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
    }

    /// Reaps instances this agent started that have ended, so their group id is free.
    fn reap(&self) {
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        children.retain(|_, child| matches!(child.try_wait(), Ok(None)));
    }

    /// The lowest uid of the range that no instance of this executor has and no process of
    /// the node runs as (a leftover, or another agent's instance).
    fn free_uid(&self, sandbox: &Sandbox, id: &str) -> Result<u32, AgentError> {
        let range = sandbox.uids();
        let mut taken: BTreeSet<u32> = self
            .read_instances()
            .into_iter()
            .filter(|f| f.reservation_id != id)
            .filter_map(|f| f.uid)
            .collect();
        taken.extend(process_uids().into_iter().filter(|u| range.contains(u)));
        range.clone().find(|u| !taken.contains(u)).ok_or_else(|| {
            exec_error(
                "start",
                id,
                format!(
                    "all {} instance uids from {} are in use",
                    sandbox::UID_RANGE,
                    range.start
                ),
            )
        })
    }

    /// The instance's environment: defaults a tenant may change, the tenant's variables
    /// (less the reserved ones), then the reserved ones, which no tenant sets.
    fn environment(
        &self,
        a: &Assignment,
        home: &Path,
        volume: Option<&Path>,
    ) -> Vec<(String, OsString)> {
        let isolated = self.sandbox.is_some();
        let visible = a.gpus.join(",");
        let mut env: Vec<(String, OsString)> = Vec::new();
        let path = match std::env::var_os("PATH") {
            Some(p) if !isolated => p,
            _ => sandbox::SYSTEM_PATH.into(),
        };
        env.push(("PATH".into(), path));
        if let Some(ld) = std::env::var_os("LD_LIBRARY_PATH") {
            env.push(("LD_LIBRARY_PATH".into(), ld));
        }
        env.extend(
            a.env
                .iter()
                .chain(&a.secrets.0)
                .filter(|(k, _)| !is_reserved_env(k) && k.as_str() != "HOME")
                .map(|(k, v)| (k.clone(), OsString::from(v))),
        );
        let (home, checkpoint): (OsString, Option<OsString>) = if isolated {
            (
                sandbox::HOME.into(),
                volume.map(|_| sandbox::CHECKPOINT.into()),
            )
        } else {
            (home.into(), volume.map(Into::into))
        };
        env.push(("HOME".into(), home));
        env.push(("CUDA_VISIBLE_DEVICES".into(), visible.clone().into()));
        env.push(("NVIDIA_VISIBLE_DEVICES".into(), visible.into()));
        env.push((
            "GPURENT_RESERVATION_ID".into(),
            a.reservation_id.clone().into(),
        ));
        env.push(("GPURENT_EPOCH".into(), a.epoch.to_string().into()));
        env.extend(
            self.gpu_limits
                .env(a)
                .into_iter()
                .map(|(k, v)| (k, OsString::from(v))),
        );
        for (k, v) in self.resources.for_instance(a.gpus.len()).env() {
            env.push((k.into(), v.into()));
        }
        if let Some(dir) = checkpoint {
            env.push(("GPURENT_CHECKPOINT_DIR".into(), dir));
        }
        env
    }

    /// SIGTERM to the instance's workload. Isolated: to every process of its cgroup that runs
    /// as its uid (the wrapper and bwrap, the agent's, stay to record how it ended);
    /// unisolated: to its process group and cgroup.
    fn terminate(&self, f: &InstanceFile) {
        let id = &f.reservation_id;
        match (f.uid, &self.cgroup) {
            (Some(uid), Some(cg)) => {
                for pid in cg.pids(id) {
                    if process_uid(pid) == Some(uid) {
                        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
                    }
                }
            }
            _ => {
                let _ = killpg(Pid::from_raw(f.pgid), Signal::SIGTERM);
                if let Some(cg) = &self.cgroup {
                    for pid in cg.pids(id) {
                        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
                    }
                }
            }
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Makes `uid` the owner of `root` and everything under it, links not followed (a directory
/// an earlier instance of the reservation, with another uid, wrote to).
fn chown_tree(root: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(root, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(root)?.is_dir() {
        for entry in std::fs::read_dir(root)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

/// The real uid of a process, from `/proc/PID/status`.
fn process_uid(pid: i32) -> Option<u32> {
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
fn process_start(pid: i32) -> Option<u64> {
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
fn process_environment(pid: i32) -> Vec<(OsString, OsString)> {
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
fn process_uids() -> BTreeSet<u32> {
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
fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`; the name may hold spaces and parentheses.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether a process of the group still runs. Zombies do not count: a killed workload's
/// children are orphaned to the init process, which may take a while to reap them.
fn group_runs(pgid: i32) -> bool {
    if killpg(Pid::from_raw(pgid), None).is_err() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
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
    })
}

#[async_trait]
impl Executor for ProcessExecutor {
    fn name(&self) -> &'static str {
        "process"
    }

    fn isolated(&self) -> bool {
        self.is_isolated()
    }

    async fn start(&self, a: &Assignment, volume: Option<&Path>) -> Result<(), AgentError> {
        let id = &a.reservation_id;
        // Run without its image, a job would get the node's own system instead of what it
        // asked for: refused, saying why, rather than run on the wrong software.
        if let Some(image) = &a.image {
            return Err(exec_error(
                "start",
                id,
                format!(
                    "this node runs no containers (no Docker Engine: its instances run as processes on the node's own system), so the image {image} cannot run here; reserve without --image"
                ),
            ));
        }
        let Some((program, args)) = a.command.split_first() else {
            return Err(exec_error(
                "start",
                id,
                "the process executor needs a command",
            ));
        };
        let dir = self.instance_dir(id);
        let home = self.home_path(id);
        std::fs::create_dir_all(&home).map_err(|e| exec_error("start", id, e))?;
        set_mode(&dir, 0o700).map_err(|e| exec_error("start", id, e))?;
        set_mode(&home, 0o700).map_err(|e| exec_error("start", id, e))?;
        let _ = std::fs::remove_file(dir.join("exit_code"));
        // The uid is chosen and recorded under one lock, so two starts never share one.
        let _uid_guard = self.uid_lock.lock().await;
        let uid = match &self.sandbox {
            Some(sandbox) => {
                let uid = self.free_uid(sandbox, id)?;
                chown_tree(&home, uid).map_err(|e| exec_error("start", id, e))?;
                if let Some(volume) = volume {
                    chown_tree(volume, uid).map_err(|e| {
                        exec_error("start", id, format!("chown {}: {e}", volume.display()))
                    })?;
                }
                Some(uid)
            }
            None => None,
        };
        let procs = match &self.cgroup {
            Some(cg) => cg
                .create(id, self.limits(a.gpus.len()))
                .map_err(|e| exec_error("start", id, e))?,
            None => Vec::new(),
        };
        let output = std::fs::File::create(dir.join("output.log"))
            .map_err(|e| exec_error("start", id, e))?;
        let errors = output.try_clone().map_err(|e| exec_error("start", id, e))?;
        let env = self.environment(a, &home, volume);
        let mut command = tokio::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg("gpurent-instance")
            .arg(procs.len().to_string())
            .args(&procs)
            .arg(dir.join("exit_code"))
            .arg(&self.mv)
            .arg(if uid.is_some() { "1" } else { "0" })
            // Nothing of the agent's environment (its join token, say) leaks into the workload.
            .env_clear()
            .stdout(output)
            .stderr(errors)
            .process_group(0)
            .kill_on_drop(false);
        let options = match (&self.sandbox, uid) {
            (Some(sandbox), Some(uid)) => {
                // The wrapper runs with a fixed environment; the tenant's goes to bwrap's
                // options on the wrapper's stdin (fd 3 of bwrap), in no command line.
                command
                    .env("PATH", sandbox::SYSTEM_PATH)
                    .args(sandbox.command_prefix(uid))
                    .current_dir(&dir)
                    .stdin(std::process::Stdio::piped());
                let spec = sandbox::Spec {
                    home: &home,
                    volume,
                    env: &env,
                    gpus: &a.gpus,
                };
                Some(
                    sandbox
                        .options_bytes(&spec)
                        .map_err(|e| exec_error("start", id, e))?,
                )
            }
            _ => {
                command
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .current_dir(&home)
                    .stdin(std::process::Stdio::null());
                None
            }
        };
        command.arg(program).args(args);
        let mut child = command.spawn().map_err(|e| exec_error("start", id, e))?;
        if let (Some(options), Some(mut stdin)) = (options, child.stdin.take()) {
            // bwrap reads them all before it starts anything; a bwrap that failed before
            // reading them ends with its exit code, which the wrapper records.
            if let Err(e) = stdin.write_all(&options).await {
                tracing::warn!(reservation_id = %id, error = %e, "could not hand the sandbox its options");
            }
        }
        let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let file = InstanceFile {
            reservation_id: id.clone(),
            epoch: a.epoch,
            pgid,
            uid,
        };
        let json = serde_json::to_vec(&file).map_err(|e| exec_error("start", id, e))?;
        std::fs::write(dir.join("instance.json"), json).map_err(|e| exec_error("start", id, e))?;
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), child);
        tracing::info!(reservation_id = %id, pgid, ?uid, gpus = %a.gpus.join(","), confined = self.cgroup.is_some(), "process instance started");
        Ok(())
    }

    async fn stop(&self, id: &str, grace: Option<Duration>) -> Result<(), AgentError> {
        let grace = grace.unwrap_or(self.grace);
        let dir = self.instance_dir(id);
        let file: Option<InstanceFile> = std::fs::read(dir.join("instance.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(f) = &file {
            // SIGTERM first, SIGKILL when the grace period is over.
            self.terminate(f);
            let deadline = tokio::time::Instant::now() + grace;
            while self.group_alive(f) && tokio::time::Instant::now() < deadline {
                self.reap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if self.group_alive(f) {
                let _ = killpg(Pid::from_raw(f.pgid), Signal::SIGKILL);
                if let Some(cg) = &self.cgroup {
                    cg.kill(id).map_err(|e| exec_error("stop", id, e))?;
                }
                for _ in 0..100 {
                    self.reap();
                    if !self.group_alive(f) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            if self.group_alive(f) {
                return Err(exec_error("stop", id, "its processes survived SIGKILL"));
            }
        }
        self.reap();
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(cg) = &self.cgroup {
            // The kernel frees a cgroup a moment after its last task is reaped (EBUSY until).
            let mut removed = cg.remove(id);
            for _ in 0..50 {
                if removed.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                removed = cg.remove(id);
            }
            removed.map_err(|e| exec_error("stop", id, e))?;
        }
        if let Some(f) = &file {
            self.keep_output(f);
        }
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(exec_error("stop", id, e)),
            _ => Ok(()),
        }
    }

    async fn list(&self) -> Result<Vec<Observed>, AgentError> {
        self.reap();
        Ok(self
            .read_instances()
            .into_iter()
            .map(|f| {
                let exit = self.exit_code(&f.reservation_id);
                let state = match exit {
                    Some(code) => ObservedState::Exited(code),
                    None if self.group_alive(&f) => ObservedState::Running,
                    // The wrapper may have written its code and ended since it was read.
                    None => match self.exit_code(&f.reservation_id) {
                        Some(code) => ObservedState::Exited(code),
                        // Killed from outside, wrapper and all: no exit code was written.
                        None => ObservedState::Exited(137),
                    },
                };
                Observed {
                    reservation_id: f.reservation_id,
                    epoch: f.epoch,
                    state,
                }
            })
            .collect())
    }

    async fn read_output(
        &self,
        id: &str,
        offset: u64,
        max: usize,
    ) -> Result<Option<Vec<u8>>, AgentError> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = match self.output_file(id) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(exec_error("read the output of", id, e)),
        };
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| exec_error("read the output of", id, e))?;
        let mut buf = Vec::new();
        file.take(max as u64)
            .read_to_end(&mut buf)
            .map_err(|e| exec_error("read the output of", id, e))?;
        Ok(Some(buf))
    }

    async fn output_size(&self, id: &str) -> Result<Option<u64>, AgentError> {
        match self.output_file(id).and_then(|f| f.metadata()) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(exec_error("read the output of", id, e)),
        }
    }

    async fn kept_outputs(&self) -> Result<Vec<(String, i64)>, AgentError> {
        Ok(self
            .kept()
            .into_iter()
            .map(|(id, epoch, _)| (id, epoch))
            .collect())
    }

    async fn forget_output(&self, id: &str, epoch: i64) -> Result<(), AgentError> {
        match std::fs::remove_file(self.kept_path(id, epoch)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(exec_error("forget the output of", id, e))
            }
            _ => Ok(()),
        }
    }

    async fn enter(&self, id: &str, request: EntryRequest) -> Result<Entered, EntryError> {
        let target = self
            .entry_target(id)
            .ok_or_else(|| EntryError::NotRunning {
                reservation_id: id.to_owned(),
            })?;
        match &request.kind {
            // Instances share the node's network.
            EntryKind::Tcp { port } => tcp::connect(id, *port, None).await,
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

    async fn owner_of(&self, pid: u32) -> Option<String> {
        if let Some(cg) = &self.cgroup {
            return cg.owner_of(pid);
        }
        let pgid = process_group_of(pid)?;
        self.read_instances()
            .into_iter()
            .find(|f| f.pgid == pgid)
            .map(|f| f.reservation_id)
    }
}

/// The process group of `pid`, from `/proc/PID/stat` (the field after state and ppid).
fn process_group_of(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: read after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}
