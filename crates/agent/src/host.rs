//! What the agent finds of its host when it starts, for the control plane's host verification:
//! driver and CUDA versions (from the GPU backend), the NVIDIA container toolkit's version, and
//! the free space of the data directory, its cores and memory.

use std::path::Path;
use std::process::Command;

use gpurent_types::agent::{HostFacts, NodeTelemetry};

use crate::AgentError;

/// The facts, from a telemetry sample of the GPU backend and the data directory. `gpu_containers`:
/// whether this node runs real GPUs in containers (then the toolkit is needed); `isolated`:
/// whether its executor isolates instances; `shared_network`: whether they share its network.
pub(crate) fn host_facts(
    sample: Option<&NodeTelemetry>,
    data_dir: &Path,
    gpu_containers: bool,
    (isolated, shared_network): (bool, bool),
) -> HostFacts {
    let capacity = crate::executor::HostCapacity::detect();
    HostFacts {
        driver_version: sample.and_then(|s| s.driver_version.clone()),
        cuda_version: sample.and_then(|s| s.cuda_version.clone()),
        container_toolkit: toolkit_version(),
        gpu_containers,
        disk_free_mb: disk_free_mb(data_dir),
        isolated: Some(isolated),
        shared_network: Some(shared_network),
        cpus: capacity.map(|c| c.cpus()),
        memory_mb: capacity.map(|c| c.memory_mb),
        agent_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        volumes: None,
    }
}

/// `nvidia-ctk --version` prints `NVIDIA Container Toolkit CLI version 1.17.8` (and a commit
/// line); `None` when the toolkit is not installed or says nothing readable.
fn toolkit_version() -> Option<String> {
    let out = Command::new("nvidia-ctk").arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    parse_toolkit_version(&String::from_utf8_lossy(&out.stdout))
}

fn parse_toolkit_version(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.split("version").nth(1))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The first NVIDIA Container Toolkit release without a known container escape:
/// CVE-2024-0132 (fixed in 1.16.2) and CVE-2025-23266 "NVIDIAScape" (fixed in 1.17.8).
pub const SAFE_TOOLKIT: [u64; 3] = [1, 17, 8];

/// The numbers of a version such as `1.17.8` or `1.17.8-rc.1` (what follows a dash ignored).
fn version_numbers(version: &str) -> Vec<u64> {
    version
        .split('-')
        .next()
        .unwrap_or_default()
        .split('.')
        .map_while(|p| p.trim().parse().ok())
        .collect()
}

/// Whether this toolkit version has a known container escape (older than `SAFE_TOOLKIT`).
/// A version that does not read as numbers counts as vulnerable: it cannot be shown safe.
pub fn toolkit_is_vulnerable(version: &str) -> bool {
    let numbers = version_numbers(version);
    numbers.is_empty() || numbers.as_slice() < SAFE_TOOLKIT.as_slice()
}

/// Refuses a node that runs GPUs in containers with a toolkit that has a known escape.
pub(crate) fn check_toolkit(facts: &HostFacts) -> Result<(), AgentError> {
    match &facts.container_toolkit {
        Some(version) if facts.gpu_containers && toolkit_is_vulnerable(version) => {
            Err(AgentError::VulnerableToolkit {
                version: version.clone(),
                safe: SAFE_TOOLKIT.map(|n| n.to_string()).join("."),
            })
        }
        _ => Ok(()),
    }
}

fn disk_free_mb(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let bytes = st.blocks_available().saturating_mul(st.fragment_size());
    Some(bytes / (1024 * 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolkits_with_a_known_escape_are_refused() {
        for v in ["1.16.1", "1.16.2", "1.17.7", "1.17", "1.9.0", "garbage", ""] {
            assert!(toolkit_is_vulnerable(v), "{v}");
        }
        for v in ["1.17.8", "1.17.8-rc.1", "1.17.10", "1.18.0", "2.0"] {
            assert!(!toolkit_is_vulnerable(v), "{v}");
        }
        let facts = |toolkit: &str, gpu_containers| HostFacts {
            driver_version: None,
            cuda_version: None,
            container_toolkit: Some(toolkit.to_owned()),
            gpu_containers,
            disk_free_mb: None,
            isolated: Some(true),
            shared_network: Some(false),
            ..HostFacts::default()
        };
        let refused = check_toolkit(&facts("1.17.7", true))
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("1.17.7") && refused.contains("1.17.8"),
            "{refused}"
        );
        assert!(check_toolkit(&facts("1.17.8", true)).is_ok());
        // Processes or simulated GPUs do not go through the toolkit.
        assert!(check_toolkit(&facts("1.17.7", false)).is_ok());
    }

    #[test]
    fn reads_the_toolkit_version() {
        let text = "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d\n";
        assert_eq!(parse_toolkit_version(text).as_deref(), Some("1.17.8"));
        assert_eq!(parse_toolkit_version("nothing here"), None);
    }

    #[test]
    fn reports_free_disk_and_versions() {
        let dir = tempfile::tempdir().unwrap();
        let sample = NodeTelemetry {
            driver_version: Some("580.95.05".into()),
            cuda_version: Some("13.0".into()),
            ..NodeTelemetry::default()
        };
        let f = host_facts(Some(&sample), dir.path(), false, (true, false));
        assert_eq!(f.driver_version.as_deref(), Some("580.95.05"));
        assert_eq!(f.cuda_version.as_deref(), Some("13.0"));
        assert!(f.disk_free_mb.is_some_and(|mb| mb > 0));
        assert!(!f.gpu_containers);
        // The cores this process may use, and the host's memory.
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(f.cpus, Some(u32::try_from(cores).unwrap()));
        assert!(f.memory_mb.is_some_and(|mb| mb > 0));
        assert_eq!(
            host_facts(None, Path::new("/no/such/dir"), true, (true, false)).disk_free_mb,
            None
        );
    }
}
