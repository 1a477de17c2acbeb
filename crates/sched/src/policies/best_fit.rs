//! Best fit: the node with the least CPU and GPU left after placing the pod, both normalised by
//! the largest node, weighted equally; shares go to the fullest GPU that fits.

use super::{Policy, Scored, MAX_SCORE, MAX_SPEC_CPU, MAX_SPEC_GPU};
use crate::cluster::{Cluster, Pod};

#[derive(Debug, Clone, Copy, Default)]
pub struct BestFit;

impl Policy for BestFit {
    fn name(&self) -> &'static str {
        "best-fit"
    }

    #[allow(clippy::cast_possible_truncation)] // the reference truncates to an integer score
    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        let n = &cluster.nodes[node];
        let cpu_left = n.cpu_free.saturating_sub(pod.cpu_milli) as f64;
        let gpu_left = n.gpu_free_total().saturating_sub(pod.gpu.total_milli()) as f64;
        let left = 0.5 * cpu_left / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU;
        Scored::new(((1.0 - left) * MAX_SCORE as f64) as i64)
    }
}
