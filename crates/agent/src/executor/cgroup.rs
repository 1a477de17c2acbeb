//! cgroup v2 confinement for the process executor: one cgroup per reservation under a root
//! (`/sys/fs/cgroup/gpurent` by default) with `cpu.max`, `memory.max` and `pids.max`.

use std::path::{Path, PathBuf};

/// Limits of one instance's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// CPUs as a quota: 4 means 400 ms of CPU time per 100 ms.
    pub cpus: u32,
    pub memory_bytes: u64,
    pub pids: u64,
}

const CPU_PERIOD_US: u64 = 100_000;
const CONTROLLERS: &str = "+cpu +memory +pids";

#[derive(Debug, Clone)]
pub struct CgroupRoot {
    path: PathBuf,
}

impl CgroupRoot {
    /// Prepares `root` (its parent must be a cgroup v2 directory we may write): enables the
    /// cpu, memory and pids controllers for it and for its children. Err says why not.
    pub fn prepare(root: &Path) -> Result<Self, String> {
        let parent = root
            .parent()
            .ok_or_else(|| format!("{} has no parent", root.display()))?;
        if !parent.join("cgroup.controllers").exists() {
            return Err(format!("{} is not a cgroup v2 directory", parent.display()));
        }
        let available =
            std::fs::read_to_string(parent.join("cgroup.controllers")).map_err(|e| {
                format!(
                    "cannot read {}: {e}",
                    parent.join("cgroup.controllers").display()
                )
            })?;
        for c in ["cpu", "memory", "pids"] {
            if !available.split_whitespace().any(|a| a == c) {
                return Err(format!(
                    "the {c} controller is not available in {}",
                    parent.display()
                ));
            }
        }
        let enable = |dir: &Path| {
            std::fs::write(dir.join("cgroup.subtree_control"), CONTROLLERS)
                .map_err(|e| format!("cannot enable {CONTROLLERS} in {}: {e}", dir.display()))
        };
        enable(parent)?;
        std::fs::create_dir_all(root)
            .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        enable(root)?;
        Ok(CgroupRoot {
            path: root.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn instance(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Creates the instance's cgroup and writes its limits.
    pub fn create(&self, name: &str, limits: CgroupLimits) -> std::io::Result<PathBuf> {
        let dir = self.instance(name);
        std::fs::create_dir_all(&dir)?;
        let quota = u64::from(limits.cpus) * CPU_PERIOD_US;
        std::fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}"))?;
        std::fs::write(dir.join("memory.max"), limits.memory_bytes.to_string())?;
        // No swap: a limit that swaps would make the GPU job crawl instead of failing clearly.
        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        std::fs::write(dir.join("pids.max"), limits.pids.to_string())?;
        Ok(dir)
    }

    /// The processes in an instance's cgroup.
    pub fn pids(&self, name: &str) -> Vec<i32> {
        std::fs::read_to_string(self.instance(name).join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every process in the cgroup at once (`cgroup.kill`, Linux 5.14+).
    pub fn kill(&self, name: &str) -> std::io::Result<()> {
        std::fs::write(self.instance(name).join("cgroup.kill"), "1")
    }

    /// Removes an empty instance cgroup.
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        match std::fs::remove_dir(self.instance(name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// The instance whose cgroup holds `pid`, read from `/proc/PID/cgroup`.
    pub fn owner_of(&self, pid: u32) -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let mount = Path::new("/sys/fs/cgroup");
        let relative = self.path.strip_prefix(mount).ok()?;
        let prefix = format!("/{}/", relative.display());
        text.lines()
            .filter_map(|l| l.strip_prefix("0::"))
            .find_map(|p| p.strip_prefix(&prefix))
            .map(|rest| rest.split('/').next().unwrap_or(rest).to_owned())
    }
}
