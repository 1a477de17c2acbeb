//! Dot product (Tetris): the node whose free (CPU, GPU) vector, normalised by the largest node,
//! has the smallest dot product with the request; shares compare each partly used GPU and the
//! node's free whole GPUs as separate candidates.

use super::{Policy, Scored, MAX_SCORE, MAX_SPEC_CPU, MAX_SPEC_GPU};
use crate::cluster::{Cluster, GpuDemand, Pod, MILLI};

#[derive(Debug, Clone, Copy, Default)]
pub struct DotProduct;

impl Policy for DotProduct {
    fn name(&self) -> &'static str {
        "dot-product"
    }

    #[allow(clippy::cast_possible_truncation)] // the reference truncates to an integer score
    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        let n = &cluster.nodes[node];
        let cpu = n.cpu_free as f64 / MAX_SPEC_CPU * (pod.cpu_milli as f64 / MAX_SPEC_CPU);
        let req_gpu = pod.gpu.total_milli() as f64 / MAX_SPEC_GPU;
        let value = |gpu_left: f64| 1.0 - (cpu + gpu_left / MAX_SPEC_GPU * req_gpu) / 2.0;
        let mut best: Option<(f64, Option<usize>)> = None;
        if let GpuDemand::Share(m) = pod.gpu {
            for (i, &f) in n.gpu_free.iter().enumerate() {
                if f < MILLI && f >= m {
                    let v = value(f64::from(f));
                    if best.is_none_or(|(b, _)| v > b) {
                        best = Some((v, Some(i)));
                    }
                }
            }
        }
        let whole = f64::from(n.whole_free() * MILLI);
        if pod.gpu.total_milli() as f64 <= whole {
            let v = value(whole);
            if best.is_none_or(|(b, _)| v > b) {
                // Whole-free GPU for a share: the lowest-indexed free one.
                let gpu = match pod.gpu {
                    GpuDemand::Share(_) => n.lowest_free_gpus(1).first().copied(),
                    _ => None,
                };
                best = Some((v, gpu));
            }
        }
        match best {
            Some((v, gpu)) => Scored {
                score: (v * MAX_SCORE as f64) as i64,
                share_gpu: gpu,
            },
            None => Scored::new(0),
        }
    }
}
