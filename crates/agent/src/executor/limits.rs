//! What an instance is told of its GPU memory: `GPURENT_VRAM_LIMIT_MB` always (its share, or
//! its whole GPU's memory), and on a node that runs NVIDIA's MPS (`--mps`) the MPS client
//! limits of a share, which the CUDA driver enforces.

use std::collections::BTreeMap;

use gpurent_types::agent::Assignment;

/// The node's GPUs as the limits need them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuLimits {
    /// Each GPU's memory, MiB, by UUID.
    pub memory_mb: BTreeMap<String, u64>,
    /// The MPS control daemon runs (checked at start, `crate::mps`): shares get MPS limits.
    pub mps: bool,
}

impl GpuLimits {
    /// The variables for the instance of `a` (all reserved: `GPURENT_*`, `CUDA_MPS_*` are set
    /// after the tenant's and win).
    pub fn env(&self, a: &Assignment) -> Vec<(String, String)> {
        let mut env = Vec::new();
        // A multi-GPU reservation has GPUs of one model; each process sees one GPU's worth.
        let card_mb = a
            .gpus
            .iter()
            .map(|g| self.memory_mb.get(g).copied())
            .collect::<Option<Vec<u64>>>()
            .and_then(|m| m.into_iter().min());
        let Some(limit) = a.vram_mb.or(card_mb) else {
            return env;
        };
        env.push(("GPURENT_VRAM_LIMIT_MB".to_owned(), limit.to_string()));
        if let (true, Some(share)) = (self.mps, a.vram_mb) {
            // By the device's index among those the instance sees (NVIDIA's format).
            let pinned: Vec<String> = (0..a.gpus.len().max(1))
                .map(|i| format!("{i}={share}M"))
                .collect();
            env.push((
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
                pinned.join(","),
            ));
            if let Some(card) = card_mb.filter(|c| *c > 0) {
                let percent = (share.saturating_mul(100) / card).clamp(1, 100);
                env.push((
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_owned(),
                    percent.to_string(),
                ));
            }
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(gpus: &[&str], vram_mb: Option<u64>) -> Assignment {
        Assignment {
            reservation_id: "r".into(),
            epoch: 1,
            restart_count: 0,
            array_index: None,
            gpus: gpus.iter().map(|g| (*g).to_owned()).collect(),
            vram_mb,
            image: None,
            command: vec![],
            env: Default::default(),
            run: true,
            log_offset: 0,
            stop_grace_s: None,
            checkpoint: false,
            secrets: Default::default(),
            sealed_secrets: None,
            ports: vec![],
            mounts: Vec::new(),
        }
    }

    fn limits(mps: bool) -> GpuLimits {
        GpuLimits {
            memory_mb: BTreeMap::from([
                ("GPU-a".to_owned(), 143_771),
                ("GPU-b".to_owned(), 143_771),
            ]),
            mps,
        }
    }

    fn env(l: &GpuLimits, a: &Assignment) -> Vec<(&'static str, String)> {
        let names = [
            "GPURENT_VRAM_LIMIT_MB",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        ];
        l.env(a)
            .into_iter()
            .map(|(k, v)| {
                let name = names.iter().find(|n| **n == k).copied().unwrap_or("?");
                (name, v)
            })
            .collect()
    }

    #[test]
    fn a_share_gets_its_memory_and_with_mps_its_pinned_limit_and_threads() {
        let share = assignment(&["GPU-a"], Some(40_960));
        assert_eq!(
            env(&limits(false), &share),
            vec![("GPURENT_VRAM_LIMIT_MB", "40960".to_owned())]
        );
        assert_eq!(
            env(&limits(true), &share),
            vec![
                ("GPURENT_VRAM_LIMIT_MB", "40960".to_owned()),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=40960M".to_owned()),
                // 40960 / 143771 of the card: 28%.
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "28".to_owned()),
            ]
        );
        // A sliver of the card still gets a thread percentage.
        let sliver = assignment(&["GPU-a"], Some(100));
        assert_eq!(
            env(&limits(true), &sliver)[2],
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "1".to_owned())
        );
    }

    #[test]
    fn whole_gpus_get_the_cards_memory_and_no_mps_limits() {
        let whole = assignment(&["GPU-a", "GPU-b"], None);
        assert_eq!(
            env(&limits(true), &whole),
            vec![("GPURENT_VRAM_LIMIT_MB", "143771".to_owned())]
        );
        // A GPU the node does not know of: nothing to say rather than a wrong figure.
        assert_eq!(env(&limits(true), &assignment(&["GPU-x"], None)), vec![]);
    }
}
