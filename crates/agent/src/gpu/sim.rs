//! Simulated GPUs from a spec such as `2xRTX4090,1xA100-80GB`, with stable UUIDs derived from
//! the node name so that a restarted agent reports the same GPUs.

use gpurent_types::agent::{GpuInfo, GpuSample, NodeTelemetry};
use gpurent_types::GpuType;
use sha2::{Digest, Sha256};

use super::GpuBackend;
use crate::AgentError;

/// Memory of well-known models in MiB, as their drivers report it.
const KNOWN_VRAM_MB: [(&str, u64); 10] = [
    ("rtx3090", 24_576),
    ("rtx4090", 24_564),
    ("rtx5090", 32_607),
    ("l40s", 46_068),
    ("a10040gb", 40_960),
    ("a10080gb", 81_920),
    ("a100", 40_960),
    ("h10080gb", 81_559),
    ("h100", 81_559),
    ("h200", 143_771),
];
const DEFAULT_VRAM_MB: u64 = 24_576;
const MAX_SIM_GPUS: u32 = 100_000;

#[derive(Debug, Clone)]
pub struct SimGpus {
    gpus: Vec<GpuInfo>,
}

impl SimGpus {
    /// Parses `COUNTxMODEL[/PER_SWITCH][,COUNTxMODEL...]` (`x` or `*`); a bare model means one
    /// GPU. `8xH100/4` declares two PCIe switches of four GPUs each (no suffix: topology unknown).
    pub fn parse(spec: &str, node_name: &str) -> Result<Self, AgentError> {
        let fail = |reason: &str| AgentError::SimSpec {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let mut gpus = Vec::new();
        let mut switches = 0u32;
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (part, per_switch) = match part.split_once('/') {
                Some((part, n)) => match n.trim().parse::<u32>() {
                    Ok(n) if n > 0 => (part.trim(), Some(n)),
                    _ => return Err(fail("GPUs per switch must be a whole number of at least 1")),
                },
                None => (part, None),
            };
            let (count, model) = match part.split_once(['x', '*']) {
                Some((n, model)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => (
                    n.parse::<u32>().map_err(|_| fail("count too large"))?,
                    model,
                ),
                _ => (1, part),
            };
            if count == 0 {
                return Err(fail("a count must be at least 1"));
            }
            let gpu_type = GpuType::parse(model).map_err(|e| fail(&e.to_string()))?;
            let vram_mb = KNOWN_VRAM_MB
                .iter()
                .find(|(k, _)| *k == gpu_type.key())
                .map_or(DEFAULT_VRAM_MB, |(_, mb)| *mb);
            for i in 0..count {
                let index = u32::try_from(gpus.len()).map_err(|_| fail("too many GPUs"))?;
                if index >= MAX_SIM_GPUS {
                    return Err(fail("too many GPUs"));
                }
                let mut gpu = GpuInfo::basic(
                    index,
                    sim_uuid(node_name, index),
                    gpu_type.display().to_owned(),
                    vram_mb,
                );
                gpu.switch_group = per_switch.map(|n| switches + i / n);
                gpus.push(gpu);
            }
            if let Some(n) = per_switch {
                switches += count.div_ceil(n);
            }
        }
        if gpus.is_empty() {
            return Err(fail("no GPUs in it"));
        }
        Ok(SimGpus { gpus })
    }
}

/// `GPU-` and a UUID-shaped hash of node and index, like NVML's `GPU-cce5198b-...`.
fn sim_uuid(node_name: &str, index: u32) -> String {
    let h = hex::encode(Sha256::digest(format!("{node_name}/{index}").as_bytes()));
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl GpuBackend for SimGpus {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, AgentError> {
        Ok(self.gpus.clone())
    }

    /// Simulated GPUs are always idle and cool.
    fn sample(&self) -> Result<NodeTelemetry, AgentError> {
        Ok(NodeTelemetry {
            driver_version: None,
            cuda_version: None,
            gpus: self
                .gpus
                .iter()
                .map(|g| GpuSample {
                    uuid: g.uuid.clone(),
                    utilization_pct: 0,
                    memory_used_mb: 0,
                    temperature_c: 30,
                    power_mw: 0,
                    ecc_uncorrected: 0,
                    memory_total_mb: g.vram_mb,
                    xid_errors: Vec::new(),
                    lost: false,
                    processes: Vec::new(),
                })
                .collect(),
            // The agent adds the CPU (`crate::cpu`) and its burn-in (`crate::burn_in`).
            cpu_utilization_pct: None,
            burn_in: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let g = SimGpus::parse("2xRTX4090, 1xA100-80GB", "n1")
            .map(|s| s.gpus)
            .unwrap_or_default();
        assert_eq!(g.len(), 3);
        assert_eq!((g[0].model.as_str(), g[0].vram_mb), ("RTX4090", 24_564));
        assert_eq!(
            (g[2].model.as_str(), g[2].vram_mb, g[2].index),
            ("A100-80GB", 81_920, 2)
        );
        assert_ne!(g[0].uuid, g[1].uuid);
        let again = SimGpus::parse("2xRTX4090,1xA100-80GB", "n1")
            .map(|s| s.gpus)
            .unwrap_or_default();
        assert_eq!(g, again, "UUIDs are stable across restarts");
        assert_eq!(
            SimGpus::parse("H200", "n").map(|s| s.gpus.len()).ok(),
            Some(1)
        );
    }

    #[test]
    fn declares_switches() {
        let g = SimGpus::parse("8xH100/4, 2xRTX4090, 3xA100/2", "n")
            .map(|s| s.gpus)
            .unwrap_or_default();
        let groups: Vec<Option<u32>> = g.iter().map(|g| g.switch_group).collect();
        let (s0, s1, s2, s3) = (Some(0), Some(1), Some(2), Some(3));
        assert_eq!(
            groups,
            [s0, s0, s0, s0, s1, s1, s1, s1, None, None, s2, s2, s3]
        );
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "",
            "0xRTX4090",
            "2x",
            "99999999999xA100",
            "2x!!",
            "8xH100/0",
            "8xH100/x",
        ] {
            assert!(SimGpus::parse(bad, "n").is_err(), "{bad}");
        }
    }
}
