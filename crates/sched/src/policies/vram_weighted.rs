//! The seeds' load balancing weighted by free VRAM per request: each fitting node is drawn with
//! probability proportional to its free GPU divided by the pod's request (free CPU for a pod
//! without GPUs); a share goes to the node's GPU with the most free.

use super::{Policy, Scored};
use crate::cluster::{Cluster, GpuDemand, Pod};
use crate::rng::SimRng;

/// Draws are made with a stream of its own, from a fixed seed, so a run is reproducible.
const SEED: u64 = 0x5652_414D_5745_4947;

#[derive(Debug, Clone)]
pub struct VramWeighted {
    rng: SimRng,
}

impl Default for VramWeighted {
    fn default() -> Self {
        VramWeighted {
            rng: SimRng::new(SEED),
        }
    }
}

impl Policy for VramWeighted {
    fn name(&self) -> &'static str {
        "vram-weighted"
    }

    /// A weighted draw as a score (Efraimidis and Spirakis): each node's key is `ln(u) / w`
    /// for a uniform `u` in (0, 1]; the highest key wins with probability proportional to `w`.
    #[allow(clippy::cast_possible_truncation)] // keys are in (-1e6, 0]: far inside i64
    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        let n = &cluster.nodes[node];
        let (free, request) = match pod.gpu {
            GpuDemand::None => (n.cpu_free, pod.cpu_milli),
            _ => (n.gpu_free_total(), pod.gpu.total_milli()),
        };
        let weight = free as f64 / request.max(1) as f64;
        // 53 random bits, shifted into (0, 1].
        let u = ((self.rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let key = if weight > 0.0 { u.ln() / weight } else { -1e6 };
        let share_gpu = match pod.gpu {
            GpuDemand::Share(m) => n
                .gpu_free
                .iter()
                .enumerate()
                .filter(|(_, &f)| f >= m)
                .max_by_key(|(i, &f)| (f, std::cmp::Reverse(*i)))
                .map(|(i, _)| i),
            _ => None,
        };
        Scored {
            score: (key.max(-1e6) * 1e12) as i64,
            share_gpu,
        }
    }
}
