//! The process executor, for hosts without Docker: the reservation's command runs as a process
//! group with `CUDA_VISIBLE_DEVICES` set to its GPUs' UUIDs, in a cgroup v2 with `cpu.max`,
//! `memory.max` and `pids.max` where the cgroup tree is writable.
//!
//! Each instance has a directory under the agent's data dir (`instances/<reservation>/`) with
//! its identity (`instance.json`), its output (`output.log`) and, once it ends by itself, its
//! exit code (`exit_code`, written by the wrapper shell). A restarted agent adopts instances
//! from these directories: nothing runs twice and nothing is orphaned.

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
use super::Executor;
use crate::reconcile::{Observed, ObservedState};
use crate::AgentError;

/// Resources per GPU of a reservation (the seeds: 4 CPUs and 16 GiB per RTX 4090).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourcesPerGpu {
    pub cpus: u32,
    pub memory_mb: u64,
    pub pids: u64,
}

impl Default for ResourcesPerGpu {
    fn default() -> Self {
        ResourcesPerGpu {
            cpus: 4,
            memory_mb: 16 * 1024,
            pids: 4096,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct InstanceFile {
    reservation_id: String,
    epoch: i64,
    /// The process group, led by the wrapper shell.
    pgid: i32,
}

/// Runs `"$@"` in the instance's cgroup (when given) and records its exit code.
const WRAPPER: &str = r#"cg=$1; ex=$2; shift 2
if [ -n "$cg" ]; then echo $$ > "$cg/cgroup.procs" || exit 125; fi
"$@"; code=$?
echo $code > "$ex.tmp" && mv "$ex.tmp" "$ex"
exit $code"#;

#[derive(Debug)]
pub struct ProcessExecutor {
    dir: PathBuf,
    cgroup: Option<CgroupRoot>,
    resources: ResourcesPerGpu,
    grace: Duration,
    /// Instances this agent started: waited on so they do not linger as zombies.
    children: Mutex<HashMap<String, tokio::process::Child>>,
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
    /// `cgroup_root` None runs without resource limits (say why in the log).
    pub fn new(
        data_dir: &Path,
        cgroup_root: Option<&Path>,
        resources: ResourcesPerGpu,
    ) -> Result<Self, AgentError> {
        let dir = data_dir.join("instances");
        std::fs::create_dir_all(&dir).map_err(|source| AgentError::Identity {
            path: dir.clone(),
            source,
        })?;
        let cgroup = match cgroup_root.map(CgroupRoot::prepare) {
            Some(Ok(root)) => {
                tracing::info!(root = %root.path().display(), "process executor confines instances in cgroup v2");
                Some(root)
            }
            Some(Err(why)) => {
                tracing::warn!(%why, "process executor runs instances WITHOUT cpu, memory and pids limits");
                None
            }
            None => None,
        };
        Ok(ProcessExecutor {
            dir,
            cgroup,
            resources,
            grace: Duration::from_secs(10),
            children: Mutex::new(HashMap::new()),
        })
    }

    /// How long a stopped instance gets between SIGTERM and SIGKILL when its assignment does
    /// not say.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    pub fn is_confined(&self) -> bool {
        self.cgroup.is_some()
    }

    fn instance_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// The instance's output, for logs.
    pub fn output_path(&self, id: &str) -> PathBuf {
        self.instance_dir(id).join("output.log")
    }

    fn limits(&self, gpus: usize) -> CgroupLimits {
        let n = u32::try_from(gpus.max(1)).unwrap_or(u32::MAX);
        CgroupLimits {
            cpus: self.resources.cpus.saturating_mul(n),
            memory_bytes: self
                .resources
                .memory_mb
                .saturating_mul(u64::from(n))
                .saturating_mul(1024 * 1024),
            pids: self.resources.pids,
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
            || self
                .cgroup
                .as_ref()
                .is_some_and(|cg| !cg.pids(&f.reservation_id).is_empty())
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

    async fn start(&self, a: &Assignment, volume: Option<&Path>) -> Result<(), AgentError> {
        let id = &a.reservation_id;
        let Some((program, args)) = a.command.split_first() else {
            return Err(exec_error(
                "start",
                id,
                "the process executor needs a command",
            ));
        };
        let dir = self.instance_dir(id);
        std::fs::create_dir_all(&dir).map_err(|e| exec_error("start", id, e))?;
        let _ = std::fs::remove_file(dir.join("exit_code"));
        let cgroup = match &self.cgroup {
            Some(cg) => Some(
                cg.create(id, self.limits(a.gpus.len()))
                    .map_err(|e| exec_error("start", id, e))?,
            ),
            None => None,
        };
        let output = std::fs::File::create(dir.join("output.log"))
            .map_err(|e| exec_error("start", id, e))?;
        let errors = output.try_clone().map_err(|e| exec_error("start", id, e))?;
        let visible = a.gpus.join(",");
        let mut command = tokio::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg("gpurent-instance")
            .arg(cgroup.as_deref().map(Path::as_os_str).unwrap_or_default())
            .arg(dir.join("exit_code"))
            .arg(program)
            .args(args)
            .current_dir(&dir)
            // Nothing of the agent's environment (its join token, say) leaks into the workload.
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            )
            .env("HOME", &dir)
            .env("CUDA_VISIBLE_DEVICES", &visible)
            .env("NVIDIA_VISIBLE_DEVICES", &visible)
            .env("GPURENT_RESERVATION_ID", id)
            .env("GPURENT_EPOCH", a.epoch.to_string())
            .envs(&a.env)
            .envs(&a.secrets.0)
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(errors)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(ld) = std::env::var_os("LD_LIBRARY_PATH") {
            command.env("LD_LIBRARY_PATH", ld);
        }
        if let Some(volume) = volume {
            command.env("GPURENT_CHECKPOINT_DIR", volume);
        }
        let child = command.spawn().map_err(|e| exec_error("start", id, e))?;
        let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let file = InstanceFile {
            reservation_id: id.clone(),
            epoch: a.epoch,
            pgid,
        };
        let json = serde_json::to_vec(&file).map_err(|e| exec_error("start", id, e))?;
        std::fs::write(dir.join("instance.json"), json).map_err(|e| exec_error("start", id, e))?;
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), child);
        tracing::info!(reservation_id = %id, pgid, gpus = %visible, confined = self.cgroup.is_some(), "process instance started");
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
            let _ = killpg(Pid::from_raw(f.pgid), Signal::SIGTERM);
            if let Some(cg) = &self.cgroup {
                for pid in cg.pids(id) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
                }
            }
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
        let mut file = match std::fs::File::open(self.output_path(id)) {
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
        match std::fs::metadata(self.output_path(id)) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(exec_error("read the output of", id, e)),
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
