//! cgroup confinement for the process executor: one cgroup per reservation with CPU, memory
//! and pids limits, under a cgroup v2 root (`/sys/fs/cgroup/gpurent` by default) or, where
//! only cgroup v1 exists, under a cgroup of that name in each of the memory, cpu and pids
//! hierarchies (`/sys/fs/cgroup/{memory,cpu,pids}/gpurent`).

use std::path::{Path, PathBuf};

/// Limits of one instance's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// CPUs as a quota, in thousandths: 4000 means 400 ms of CPU time per 100 ms, 500 means
    /// 50 ms.
    pub milli_cpus: u32,
    pub memory_bytes: u64,
    pub pids: u64,
}

const CPU_PERIOD_US: u64 = 100_000;
const CONTROLLERS: &str = "+cpu +memory +pids";
/// The cgroup v1 hierarchies an instance joins, each with its own directory.
const V1_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

#[derive(Debug, Clone)]
enum Tree {
    /// The unified hierarchy: one directory holds every controller.
    V2 { root: PathBuf },
    /// One root per controller, in the order of `V1_CONTROLLERS`.
    V1 { roots: [PathBuf; 3] },
}

#[derive(Debug, Clone)]
pub struct CgroupRoot {
    tree: Tree,
}

impl CgroupRoot {
    /// Prepares `root`: a cgroup v2 directory whose parent we may write (the cpu, memory and
    /// pids controllers enabled for it and its children), else, where the parent holds the
    /// cgroup v1 memory, cpu and pids hierarchies, a cgroup named like `root` in each. Err
    /// says why neither works.
    pub fn prepare(root: &Path) -> Result<Self, String> {
        let parent = root
            .parent()
            .ok_or_else(|| format!("{} has no parent", root.display()))?;
        if parent.join("cgroup.controllers").exists() {
            return Self::prepare_v2(root, parent);
        }
        let name = root
            .file_name()
            .ok_or_else(|| format!("{} has no name", root.display()))?;
        let v1 = |c: &str| parent.join(c);
        if V1_CONTROLLERS
            .iter()
            .all(|c| v1(c).join("cgroup.procs").exists())
        {
            let roots = V1_CONTROLLERS.map(|c| v1(c).join(name));
            for dir in &roots {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            return Ok(CgroupRoot {
                tree: Tree::V1 { roots },
            });
        }
        Err(format!(
            "{} is neither a cgroup v2 directory nor holds the cgroup v1 memory, cpu and pids hierarchies",
            parent.display()
        ))
    }

    fn prepare_v2(root: &Path, parent: &Path) -> Result<Self, String> {
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
            tree: Tree::V2 {
                root: root.to_owned(),
            },
        })
    }

    /// `cgroup v2 at ROOT` or `cgroup v1 at ROOTS`, for the log.
    pub fn describe(&self) -> String {
        match &self.tree {
            Tree::V2 { root } => format!("cgroup v2 at {}", root.display()),
            Tree::V1 { roots } => format!(
                "cgroup v1 at {}",
                roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// 2 or 1.
    pub fn version(&self) -> u8 {
        match self.tree {
            Tree::V2 { .. } => 2,
            Tree::V1 { .. } => 1,
        }
    }

    /// The instance's cgroup directories: one (v2), or memory, cpu and pids (v1).
    pub fn instance(&self, name: &str) -> Vec<PathBuf> {
        match &self.tree {
            Tree::V2 { root } => vec![root.join(name)],
            Tree::V1 { roots } => roots.iter().map(|r| r.join(name)).collect(),
        }
    }

    /// Creates the instance's cgroup and writes its limits. Returns the `cgroup.procs` files
    /// a process writes its pid to, to join it.
    pub fn create(&self, name: &str, limits: CgroupLimits) -> std::io::Result<Vec<PathBuf>> {
        // cgroup v1 refuses a quota under 1 ms.
        let quota = (u64::from(limits.milli_cpus) * CPU_PERIOD_US / 1000).max(1000);
        match &self.tree {
            Tree::V2 { root } => {
                let dir = root.join(name);
                std::fs::create_dir_all(&dir)?;
                std::fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}"))?;
                std::fs::write(dir.join("memory.max"), limits.memory_bytes.to_string())?;
                // No swap: a limit that swaps would make the GPU job crawl instead of failing
                // clearly.
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                std::fs::write(dir.join("pids.max"), limits.pids.to_string())?;
                Ok(vec![dir.join("cgroup.procs")])
            }
            Tree::V1 {
                roots: [memory, cpu, pids],
            } => {
                let (memory, cpu, pids) = (memory.join(name), cpu.join(name), pids.join(name));
                for dir in [&memory, &cpu, &pids] {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(
                    memory.join("memory.limit_in_bytes"),
                    limits.memory_bytes.to_string(),
                )?;
                // Memory and swap together at the same limit (no swap), where swap accounting
                // is on.
                let _ = std::fs::write(
                    memory.join("memory.memsw.limit_in_bytes"),
                    limits.memory_bytes.to_string(),
                );
                std::fs::write(cpu.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
                std::fs::write(cpu.join("cpu.cfs_quota_us"), quota.to_string())?;
                std::fs::write(pids.join("pids.max"), limits.pids.to_string())?;
                Ok([memory, cpu, pids]
                    .into_iter()
                    .map(|d| d.join("cgroup.procs"))
                    .collect())
            }
        }
    }

    /// The processes in an instance's cgroup (in any of its v1 hierarchies).
    pub fn pids(&self, name: &str) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .instance(name)
            .iter()
            .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kills every process in the cgroup: at once with `cgroup.kill` (v2, Linux 5.14+); on v1
    /// by SIGKILL to each, again until none is left, as a process may fork meanwhile (the
    /// pids limit bounds how often).
    pub fn kill(&self, name: &str) -> std::io::Result<()> {
        match &self.tree {
            Tree::V2 { root } => std::fs::write(root.join(name).join("cgroup.kill"), "1"),
            Tree::V1 { .. } => {
                for _ in 0..100 {
                    let pids = self.pids(name);
                    if pids.is_empty() {
                        break;
                    }
                    for pid in pids {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
                Ok(())
            }
        }
    }

    /// Removes an empty instance cgroup.
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        for dir in self.instance(name) {
            match std::fs::remove_dir(dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// The instance whose cgroup holds `pid`, read from `/proc/PID/cgroup` (its unified line
    /// on v2, its pids line on v1).
    pub fn owner_of(&self, pid: u32) -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let (root, controller) = match &self.tree {
            Tree::V2 { root } => (root, ""),
            Tree::V1 { roots } => (&roots[2], "pids"),
        };
        // The path of the root inside its hierarchy: below the mount point of the hierarchy.
        let mount = if controller.is_empty() {
            Path::new("/sys/fs/cgroup").to_owned()
        } else {
            root.parent()?.to_owned()
        };
        let relative = root.strip_prefix(mount).ok()?;
        let prefix = format!("/{}/", relative.display());
        text.lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':');
                let _id = parts.next()?;
                let controllers = parts.next()?;
                let path = parts.next()?;
                let matches = if controller.is_empty() {
                    controllers.is_empty()
                } else {
                    controllers.split(',').any(|c| c == controller)
                };
                matches.then_some(path)
            })
            .find_map(|p| p.strip_prefix(&prefix))
            .map(|rest| rest.split('/').next().unwrap_or(rest).to_owned())
    }
}
