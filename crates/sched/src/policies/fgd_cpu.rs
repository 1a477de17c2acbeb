//! Ours: FGD, minus what a placement strands. A node whose CPU runs out while it still has free
//! GPU can place nothing more on that GPU; FGD looks at whether one pod of each expected shape
//! still fits, not at how much of the node's GPU its CPU can still feed, so it lets shares and
//! CPU-heavy pods drain the CPU of GPU-rich nodes (on the trace, 1-6% of all GPUs end up on nodes
//! with under two cores free). Each placement here pays for the GPU it strands.

use super::{Fgd, Policy, Scored};
use crate::cluster::{Assignment, Cluster, Pod, MILLI};
use crate::workload::Workload;

/// Score points per stranded GPU: twice the slope of FGD's sigmoid at zero (25 points per GPU
/// of fragmentation), so a GPU stranded weighs twice a GPU fragmented. The results hardly move
/// between 0.5 and 8 times that slope (BENCHMARKS.md).
const POINTS_PER_STRANDED_GPU: f64 = 50.0;
/// FGD's integer score is scaled by this before the (fractional) stranding penalty is taken
/// off, so the penalty orders nodes that FGD scores alike.
const SCALE: f64 = 1000.0;

#[derive(Debug, Clone)]
pub struct FgdCpu {
    fgd: Fgd,
    /// The milli-GPU one CPU milli feeds at the expected workload's ratio (shapes that ask for
    /// GPU, by share); 0 when the workload asks for no CPU, which turns the penalty off.
    gpu_per_cpu: f64,
}

impl FgdCpu {
    pub fn new(workload: Workload, nodes: usize) -> Self {
        let (mut cpu, mut gpu) = (0.0, 0.0);
        for (shape, share) in &workload.shapes {
            let g = shape.gpu.total_milli();
            if g > 0 {
                cpu += share * shape.cpu_milli as f64;
                gpu += share * g as f64;
            }
        }
        FgdCpu {
            fgd: Fgd::new(workload, nodes),
            gpu_per_cpu: if cpu > 0.0 { gpu / cpu } else { 0.0 },
        }
    }

    /// The node's free GPU milli that its free CPU cannot feed at the workload's ratio.
    fn stranded(&self, cpu_free: u64, gpu_free: u64) -> f64 {
        if self.gpu_per_cpu <= 0.0 {
            return 0.0;
        }
        (gpu_free as f64 - cpu_free as f64 * self.gpu_per_cpu).max(0.0)
    }
}

impl Policy for FgdCpu {
    fn name(&self) -> &'static str {
        "fgd-cpu"
    }

    #[allow(clippy::cast_possible_truncation)] // scores are far inside i64
    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        let fgd = self.fgd.score(cluster, node, pod);
        let n = &cluster.nodes[node];
        let gpu_free = n.gpu_free_total();
        let before = self.stranded(n.cpu_free, gpu_free);
        let after = self.stranded(
            n.cpu_free.saturating_sub(pod.cpu_milli),
            gpu_free.saturating_sub(pod.gpu.total_milli()),
        );
        // Truncated, not rounded: a cast, where `round` is a library call on every node.
        let penalty = (after - before) * (POINTS_PER_STRANDED_GPU * SCALE / f64::from(MILLI));
        Scored {
            score: fgd.score * SCALE as i64 - penalty as i64,
            share_gpu: fgd.share_gpu,
        }
    }

    fn placed(&mut self, cluster: &Cluster, a: &Assignment, pod: &Pod) {
        self.fgd.placed(cluster, a, pod);
    }

    fn released(&mut self, cluster: &Cluster, a: &Assignment, pod: &Pod) {
        self.fgd.released(cluster, a, pod);
    }
}
