//! The CPUs and memory an instance gets: what each reserved GPU brings (`--cpus-per-gpu`,
//! `--memory-per-gpu-gb`), clamped to the node's share per GPU of its cores and memory, so that
//! no executor asks the host for more than it has (Docker refuses a CPU quota over the host's
//! cores; a cgroup quota over them only misleads).

/// Resources per GPU of a reservation (the seeds: 4 CPUs and 16 GiB per RTX 4090). CPUs in
/// thousandths (`milli_cpus`), as a GPU's share of a small host is a fraction of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourcesPerGpu {
    pub milli_cpus: u32,
    pub memory_mb: u64,
    pub pids: u64,
}

impl Default for ResourcesPerGpu {
    fn default() -> Self {
        ResourcesPerGpu {
            milli_cpus: 4000,
            memory_mb: 16 * 1024,
            pids: 4096,
        }
    }
}

/// The least CPU an instance is given: Docker's floor (0.01 CPU); the cgroup v1 quota's floor
/// is 1 ms per 100 ms period, the same.
pub const MIN_MILLI_CPUS: u32 = 10;
/// The least memory an instance is given (Docker refuses under 6 MiB; less runs nothing).
pub const MIN_MEMORY_MB: u64 = 64;

/// The cores and memory of the node that its instances share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCapacity {
    /// Logical cores available to the agent (its affinity and cgroup quota counted), x1000.
    pub milli_cpus: u32,
    pub memory_mb: u64,
}

impl HostCapacity {
    /// This host's: the cores `available_parallelism` finds (it reads the CPU affinity and the
    /// cgroup quota), the memory `/proc/meminfo` says (`MemTotal`). None when either is
    /// unknown.
    pub fn detect() -> Option<Self> {
        let cores = std::thread::available_parallelism().ok()?.get();
        let memory_mb = parse_mem_total_mb(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
        Some(HostCapacity {
            milli_cpus: u32::try_from(cores)
                .unwrap_or(u32::MAX / 1000)
                .saturating_mul(1000),
            memory_mb,
        })
    }

    /// Whole logical cores (for the node's report).
    pub fn cpus(&self) -> u32 {
        self.milli_cpus / 1000
    }
}

/// `MemTotal:  16314420 kB` of `/proc/meminfo`, in MiB.
pub fn parse_mem_total_mb(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line
        .trim_start_matches("MemTotal:")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024)
}

impl ResourcesPerGpu {
    /// What each GPU brings, at most the node's cores and memory divided among its `gpus`
    /// (never under the floors). A share of a GPU gets its whole GPU's part: the limits are
    /// ceilings, and CPU time and page cache left unused by a neighbour are not lost (the
    /// kernel shares them out); a quarter of a core would leave a share unable to feed its GPU.
    pub fn fit(self, host: HostCapacity, gpus: usize) -> Self {
        let gpus = u64::try_from(gpus.max(1)).unwrap_or(u64::MAX);
        let cpu_part = u32::try_from(u64::from(host.milli_cpus) / gpus).unwrap_or(u32::MAX);
        ResourcesPerGpu {
            milli_cpus: self.milli_cpus.min(cpu_part).max(MIN_MILLI_CPUS),
            memory_mb: self.memory_mb.min(host.memory_mb / gpus).max(MIN_MEMORY_MB),
            pids: self.pids,
        }
    }

    /// The limits of an instance on `gpus` GPUs (a share counts as one).
    pub fn for_instance(&self, gpus: usize) -> InstanceLimits {
        let n = u32::try_from(gpus.max(1)).unwrap_or(u32::MAX);
        InstanceLimits {
            milli_cpus: self.milli_cpus.saturating_mul(n),
            memory_bytes: self
                .memory_mb
                .saturating_mul(u64::from(n))
                .saturating_mul(1024 * 1024),
            pids: self.pids,
        }
    }
}

/// One instance's CPU, memory and pids limits, as every executor applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceLimits {
    pub milli_cpus: u32,
    pub memory_bytes: u64,
    pub pids: u64,
}

impl InstanceLimits {
    /// `GPURENT_CPUS` as the instance sees it: `2`, `0.5`, `0.125`.
    pub fn cpus_text(&self) -> String {
        let whole = self.milli_cpus / 1000;
        let frac = self.milli_cpus % 1000;
        if frac == 0 {
            whole.to_string()
        } else {
            format!("{whole}.{frac:03}")
                .trim_end_matches('0')
                .to_owned()
        }
    }

    /// `GPURENT_MEMORY_MB`.
    pub fn memory_mb(&self) -> u64 {
        self.memory_bytes / (1024 * 1024)
    }

    /// The variables that tell the workload its limits (`GPURENT_CPUS`, `GPURENT_MEMORY_MB`):
    /// a thread pool sized from the host's core count would oversubscribe its quota.
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            ("GPURENT_CPUS", self.cpus_text()),
            ("GPURENT_MEMORY_MB", self.memory_mb().to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(cores: u32, memory_gb: u64) -> HostCapacity {
        HostCapacity {
            milli_cpus: cores * 1000,
            memory_mb: memory_gb * 1024,
        }
    }

    #[test]
    fn a_small_host_clamps_the_defaults() {
        let defaults = ResourcesPerGpu::default();
        // 2 cores, 2 GPUs: one core each, not four.
        let two = defaults.fit(host(2, 8), 2);
        assert_eq!(two.milli_cpus, 1000);
        assert_eq!(two.memory_mb, 4 * 1024);
        assert_eq!(two.for_instance(1).milli_cpus, 1000);
        assert_eq!(two.for_instance(2).milli_cpus, 2000);
        // 4 GPUs on 2 cores: half a core each.
        let four = defaults.fit(host(2, 8), 4);
        assert_eq!(four.milli_cpus, 500);
        assert_eq!(four.for_instance(1).cpus_text(), "0.5");
        // The whole node never asks for more than the host has.
        assert!(four.for_instance(4).milli_cpus <= 2000);
        assert!(four.for_instance(4).memory_bytes <= 8 * 1024 * 1024 * 1024);
    }

    #[test]
    fn a_large_host_keeps_the_flags() {
        let fitted = ResourcesPerGpu::default().fit(host(128, 1024), 8);
        assert_eq!(fitted, ResourcesPerGpu::default());
    }

    #[test]
    fn the_floors_hold_on_a_tiny_host() {
        let fitted = ResourcesPerGpu::default().fit(
            HostCapacity {
                milli_cpus: 1000,
                memory_mb: 100,
            },
            256,
        );
        assert_eq!(fitted.milli_cpus, MIN_MILLI_CPUS);
        assert_eq!(fitted.memory_mb, MIN_MEMORY_MB);
        // No GPU at all divides by one.
        assert_eq!(
            ResourcesPerGpu::default().fit(host(2, 8), 0).milli_cpus,
            2000
        );
    }

    #[test]
    fn cpus_read_as_decimals() {
        let text = |milli_cpus| {
            InstanceLimits {
                milli_cpus,
                memory_bytes: 0,
                pids: 0,
            }
            .cpus_text()
        };
        assert_eq!(text(4000), "4");
        assert_eq!(text(500), "0.5");
        assert_eq!(text(1250), "1.25");
        assert_eq!(text(10), "0.01");
        assert_eq!(text(333), "0.333");
    }

    #[test]
    fn meminfo_is_read_in_mib() {
        let text = "MemTotal:        8039876 kB\nMemFree:          123 kB\n";
        assert_eq!(parse_mem_total_mb(text), Some(7851));
        assert_eq!(parse_mem_total_mb("MemFree: 1 kB"), None);
        assert_eq!(parse_mem_total_mb("MemTotal: lots kB"), None);
        assert!(HostCapacity::detect().is_some_and(|h| h.milli_cpus >= 1000 && h.memory_mb > 0));
    }
}
