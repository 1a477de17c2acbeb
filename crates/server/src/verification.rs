//! Host verification: what an agent reports of its host at join (PCIe links, driver, CUDA,
//! container toolkit, free disk) judged against the owner's rules; a node that fails a check is
//! kept out of placement until it passes.

use gpurent_types::agent::{GpuInfo, HostFacts};
use gpurent_types::api::{HostCheck, HostVerification};

/// The rules, with defaults from the seeds (a link at x8 instead of x16 cost 41% more training
/// time) and what a production host needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPolicy {
    /// Oldest driver accepted (`550.54.15`), compared part by part; `None`: any.
    pub min_driver: Option<String>,
    /// Oldest CUDA accepted (`12.4`); `None`: any.
    pub min_cuda: Option<String>,
    /// Free disk the agent's data directory must have, in GiB.
    pub min_disk_free_gb: u64,
}

impl Default for HostPolicy {
    fn default() -> Self {
        HostPolicy {
            min_driver: None,
            min_cuda: None,
            min_disk_free_gb: 10,
        }
    }
}

/// Judges `facts` and the node's `gpus`. A check that cannot be made (a figure the agent could
/// not read) passes with "not reported"; every known failure fails the node.
pub fn verify(policy: &HostPolicy, facts: &HostFacts, gpus: &[GpuInfo]) -> HostVerification {
    let mut checks = Vec::new();
    for g in gpus {
        checks.push(pcie_check(g));
    }
    checks.push(version_check(
        "driver",
        facts.driver_version.as_deref(),
        policy.min_driver.as_deref(),
    ));
    checks.push(version_check(
        "cuda",
        facts.cuda_version.as_deref(),
        policy.min_cuda.as_deref(),
    ));
    checks.push(match (&facts.container_toolkit, facts.gpu_containers) {
        (Some(v), _) => pass("container_toolkit", format!("nvidia-container-toolkit {v}")),
        (None, true) => fail(
            "container_toolkit",
            "runs GPU containers but nvidia-container-toolkit was not found".into(),
        ),
        (None, false) => pass("container_toolkit", "not needed (no GPU containers)".into()),
    });
    checks.push(pass(
        "agent",
        match &facts.agent_version {
            Some(version) => format!("gpurent {version}"),
            None => "an earlier release (agent protocol 1)".into(),
        },
    ));
    checks.push(match facts.disk_free_mb {
        None => pass("disk", "not reported".into()),
        Some(mb) if mb / 1024 >= policy.min_disk_free_gb => pass(
            "disk",
            format!(
                "{} GiB free (at least {})",
                mb / 1024,
                policy.min_disk_free_gb
            ),
        ),
        Some(mb) => fail(
            "disk",
            format!(
                "{} GiB free, under {} GiB",
                mb / 1024,
                policy.min_disk_free_gb
            ),
        ),
    });
    HostVerification {
        ok: checks.iter().all(|c| c.ok),
        checks,
    }
}

fn pass(name: &str, detail: String) -> HostCheck {
    HostCheck {
        name: name.to_owned(),
        ok: true,
        detail,
    }
}

fn fail(name: &str, detail: String) -> HostCheck {
    HostCheck {
        name: name.to_owned(),
        ok: false,
        detail,
    }
}

/// The link width must be the widest the GPU and slot allow. The generation is only noted: a
/// GPU at rest trains its link down to save power and back up under load.
fn pcie_check(g: &GpuInfo) -> HostCheck {
    let name = format!("pcie:{}", g.index);
    match (g.pcie_width, g.pcie_width_max) {
        (Some(now), Some(max)) if now < max => {
            fail(&name, format!("GPU {} links at x{now} of x{max}", g.index))
        }
        (Some(now), Some(max)) => {
            let generation = match (g.pcie_gen, g.pcie_gen_max) {
                (Some(n), Some(m)) if n < m => {
                    format!(", gen {n} of {m} (idle links train down)")
                }
                (Some(n), _) => format!(", gen {n}"),
                _ => String::new(),
            };
            pass(&name, format!("x{now} of x{max}{generation}"))
        }
        _ => pass(&name, "not reported".into()),
    }
}

fn version_check(name: &str, found: Option<&str>, min: Option<&str>) -> HostCheck {
    match (found, min) {
        (Some(v), Some(min)) if older(v, min) => fail(name, format!("{v}, older than {min}")),
        (Some(v), Some(min)) => pass(name, format!("{v} (at least {min})")),
        (Some(v), None) => pass(name, v.to_owned()),
        (None, Some(min)) => fail(name, format!("not reported; at least {min} is required")),
        (None, None) => pass(name, "not reported".into()),
    }
}

/// Whether dotted version `v` is older than `min`, part by part as numbers (`550.9` < `550.54`).
fn older(v: &str, min: &str) -> bool {
    let parts = |s: &str| -> Vec<u64> {
        s.split('.')
            .map(|p| p.trim().parse::<u64>().unwrap_or(0))
            .collect()
    };
    let (a, b) = (parts(v), parts(min));
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (
            a.get(i).copied().unwrap_or(0),
            b.get(i).copied().unwrap_or(0),
        );
        if x != y {
            return x < y;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200(width: u32) -> GpuInfo {
        GpuInfo {
            pcie_gen: Some(5),
            pcie_gen_max: Some(5),
            pcie_width: Some(width),
            pcie_width_max: Some(16),
            ..GpuInfo::basic(0, "GPU-0".into(), "NVIDIA H200".into(), 143_771)
        }
    }

    fn facts() -> HostFacts {
        HostFacts {
            driver_version: Some("580.95.05".into()),
            cuda_version: Some("13.0".into()),
            container_toolkit: Some("1.17.8".into()),
            gpu_containers: true,
            disk_free_mb: Some(100 * 1024),
            isolated: Some(true),
            ..HostFacts::default()
        }
    }

    #[test]
    fn a_healthy_host_passes() {
        let v = verify(&HostPolicy::default(), &facts(), &[h200(16)]);
        assert!(v.ok, "{v:?}");
        // pcie, driver, cuda, container toolkit, agent, disk.
        assert_eq!(v.checks.len(), 6);
    }

    #[test]
    fn a_narrow_link_fails_the_node() {
        let v = verify(
            &HostPolicy::default(),
            &facts(),
            &[
                h200(16),
                GpuInfo {
                    index: 1,
                    ..h200(8)
                },
            ],
        );
        assert!(!v.ok);
        let bad: Vec<&HostCheck> = v.checks.iter().filter(|c| !c.ok).collect();
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].name, "pcie:1");
        assert_eq!(bad[0].detail, "GPU 1 links at x8 of x16");
    }

    #[test]
    fn an_idle_link_at_a_lower_generation_passes() {
        let g = GpuInfo {
            pcie_gen: Some(1),
            ..h200(16)
        };
        let v = verify(&HostPolicy::default(), &facts(), &[g]);
        assert!(v.ok);
        assert!(
            v.checks[0].detail.contains("gen 1 of 5"),
            "{:?}",
            v.checks[0]
        );
    }

    #[test]
    fn old_versions_missing_toolkit_and_full_disks_fail() {
        let policy = HostPolicy {
            min_driver: Some("580.100".into()),
            min_cuda: Some("12.4".into()),
            min_disk_free_gb: 200,
        };
        let f = HostFacts {
            container_toolkit: None,
            ..facts()
        };
        let v = verify(&policy, &f, &[h200(16)]);
        let failed: Vec<&str> = v
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(failed, ["driver", "container_toolkit", "disk"]);
        // The same host without GPU containers needs no toolkit.
        let f = HostFacts {
            gpu_containers: false,
            container_toolkit: None,
            ..facts()
        };
        assert!(verify(&HostPolicy::default(), &f, &[h200(16)]).ok);
    }

    #[test]
    fn versions_compare_part_by_part() {
        assert!(older("550.9", "550.54"));
        assert!(!older("550.54.15", "550.54"));
        assert!(older("12.4", "13.0"));
        assert!(!older("13.0", "13"));
    }

    #[test]
    fn what_was_not_reported_passes() {
        let v = verify(
            &HostPolicy::default(),
            &HostFacts::default(),
            &[GpuInfo::basic(0, "g".into(), "RTX4090".into(), 24_564)],
        );
        assert!(v.ok, "{v:?}");
    }
}
