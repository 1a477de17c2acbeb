//! GPU packing: prefer GPUs already shared, then free GPUs on a node already in use, then an
//! idle node, in three score bands as the reference simulator defines them.

use super::{Policy, Scored, MAX_SCORE};
use crate::cluster::{Cluster, GpuDemand, Pod, MILLI};

#[derive(Debug, Clone, Copy, Default)]
pub struct GpuPacking;

impl Policy for GpuPacking {
    fn name(&self) -> &'static str {
        "gpu-packing"
    }

    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        if pod.gpu == GpuDemand::None {
            return Scored::new(0);
        }
        let n = &cluster.nodes[node];
        let whole_free = i64::from(n.whole_free());
        if whole_free == n.gpu_free.len() as i64 {
            return Scored::new((MAX_SCORE / 3 - whole_free).max(whole_free));
        }
        // The GPUs it would take: fullest first among those that fit.
        let per_gpu = pod.gpu.per_gpu_milli();
        let mut order: Vec<usize> = (0..n.gpu_free.len()).collect();
        order.sort_by_key(|&i| n.gpu_free[i]);
        let used: Vec<usize> = order
            .into_iter()
            .filter(|&i| n.gpu_free[i] >= per_gpu)
            .take(pod.gpu.gpu_count() as usize)
            .collect();
        let free_used = used.iter().filter(|&&i| n.gpu_free[i] == MILLI).count() as i64;
        if free_used > 0 {
            return Scored::new((MAX_SCORE / 2 - free_used).max(MAX_SCORE / 3));
        }
        let free_pct: i64 = used
            .iter()
            .map(|&i| i64::from(n.gpu_free[i]) * 100 / i64::from(MILLI))
            .sum();
        Scored::new((MAX_SCORE - free_pct / 10).max(MAX_SCORE / 2))
    }
}
