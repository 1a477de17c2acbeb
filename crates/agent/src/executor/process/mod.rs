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
//! is orphaned. Starting is `start`, the output `output`, entering `entry`, what `/proc` says
//! `procfs`, an instance's own network `network`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use gpurent_types::agent::Assignment;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::cgroup::{CgroupLimits, CgroupRoot};
use super::limits::GpuLimits;
use super::resources::ResourcesPerGpu;
use super::sandbox::{self, Sandbox};
use super::Executor;
use crate::entry::{Entered, EntryError, EntryRequest};
use crate::reconcile::{Observed, ObservedState};
use crate::AgentError;

mod entry;
mod network;
mod output;
mod procfs;
mod scratch;
mod start;

pub use scratch::Scratch;

use network::InstanceNetwork;
pub(crate) use procfs::process_uid;
use procfs::{group_runs, process_group_of, process_state};

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
    /// Whether it has a network namespace of its own (false: the node's, as instances of
    /// earlier agents had).
    #[serde(default)]
    own_network: bool,
}

#[derive(Debug)]
pub struct ProcessExecutor {
    dir: PathBuf,
    cgroup: Option<CgroupRoot>,
    /// None: instances run unisolated, as the agent's user.
    sandbox: Option<Sandbox>,
    /// Some: each sandboxed instance gets a network namespace of its own, attached by pasta;
    /// None: instances share the node's network.
    network: Option<InstanceNetwork>,
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
    /// Sandboxed instances' directories with a size; None: unbounded (in the data dir).
    scratch: Option<Scratch>,
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
                executor.give_own_network();
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
            network: None,
            mv: sandbox::system_tool("mv").unwrap_or_else(|| "/bin/mv".into()),
            resources,
            grace: Duration::from_secs(10),
            children: Mutex::new(HashMap::new()),
            uid_lock: tokio::sync::Mutex::new(()),
            entry_helper: crate::entry::sftp::default_helper(),
            gpu_limits: GpuLimits::default(),
            scratch: None,
        })
    }

    /// Gives each sandboxed instance a directory of its disk size (`--disk-per-gpu-gb`).
    pub fn with_scratch(mut self, scratch: Scratch) -> Self {
        self.scratch = Some(scratch);
        self
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

    pub fn is_confined(&self) -> bool {
        self.cgroup.is_some()
    }

    pub fn is_isolated(&self) -> bool {
        self.sandbox.is_some()
    }

    /// Gives each sandboxed instance a network namespace of its own where this host can
    /// (pasta installed, and one probe instance started that way); else, with a warning,
    /// instances share the node's network (`network: shared` in `nodes ls`).
    fn give_own_network(&mut self) {
        let why = match InstanceNetwork::find().and_then(|mut net| {
            // Beside `instances/`, which holds only instances' directories and kept logs.
            net.write_resolv_conf(self.dir.parent().unwrap_or(&self.dir))?;
            Ok(net)
        }) {
            Ok(net) => {
                self.network = Some(net);
                match self.probe_network(&self.dir.join(".netprobe")) {
                    Ok(()) => {
                        tracing::info!(
                            address = %format!("{}/{}", network::ADDRESS, network::PREFIX),
                            gateway = network::GATEWAY,
                            "process executor gives each instance a network of its own (pasta): the node's loopback and other instances are out of its reach"
                        );
                        return;
                    }
                    Err(why) => why,
                }
            }
            Err(why) => why,
        };
        tracing::warn!(%why, "process executor runs instances in the node's network (network: shared): they reach the node's loopback services and each other's ports");
        self.network = None;
    }

    /// Instances in the node's network, even where they could have their own (`gpurent
    /// agent --shared-network`; benchmarks compare the two).
    pub fn with_shared_network(mut self) -> Self {
        if self.network.take().is_some() {
            tracing::warn!("process executor runs instances in the node's network (--shared-network): they reach the node's loopback services and each other's ports");
        }
        self
    }

    /// Whether instances share the node's network (no namespace of their own).
    pub fn shares_network(&self) -> bool {
        self.network.is_none()
    }

    /// The cgroup version instances are confined with, if any.
    pub fn cgroup_version(&self) -> Option<u8> {
        self.cgroup.as_ref().map(CgroupRoot::version)
    }

    fn instance_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
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

#[async_trait]
impl Executor for ProcessExecutor {
    fn name(&self) -> &'static str {
        "process"
    }

    fn isolated(&self) -> bool {
        self.is_isolated()
    }

    fn shared_network(&self) -> bool {
        self.shares_network()
    }

    async fn start(&self, a: &Assignment, volume: Option<&Path>) -> Result<(), AgentError> {
        self.spawn_instance(a, volume, &[]).await
    }

    async fn start_with(
        &self,
        a: &Assignment,
        volume: Option<&Path>,
        binds: &[super::Bind],
    ) -> Result<(), AgentError> {
        self.spawn_instance(a, volume, binds).await
    }

    async fn disk_usage(&self, id: &str) -> Option<gpurent_types::agent::DiskUse> {
        let usage = self.scratch.as_ref()?.usage(id)?;
        Some(gpurent_types::agent::DiskUse {
            used_bytes: usage.used_bytes,
            size_bytes: usage.size_bytes,
        })
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
        if let Some(scratch) = &self.scratch {
            scratch
                .remove(id)
                .await
                .map_err(|e| exec_error("stop", id, e))?;
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
                    pull: None,
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
        self.enter_instance(id, request).await
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
