//! Fragmentation gradient descent (FGD, Weng et al., ATC'23): the node, and for a share the GPU,
//! where placing the pod increases the expected fragmentation least.

use super::{Policy, Scored, MAX_SCORE};
use crate::cluster::{Assignment, Cluster, GpuDemand, Pod, MILLI};
use crate::workload::Workload;

#[derive(Debug, Clone)]
pub struct Fgd {
    workload: Workload,
    /// Each node's current fragmentation, `None` until computed or after the node changed.
    frag: Vec<Option<f64>>,
    scratch: Vec<u32>,
}

impl Fgd {
    pub fn new(workload: Workload, nodes: usize) -> Self {
        Fgd {
            workload,
            frag: vec![None; nodes],
            scratch: Vec::new(),
        }
    }
}

/// The reference squashes the fragmentation decrease (in GPUs) through a sigmoid into the
/// integer range 0..=100; the rounding makes near-equal nodes tie (see `TieBreak`).
#[allow(clippy::cast_possible_truncation)]
fn quantise(old: f64, new: f64) -> i64 {
    let x = (old - new) / f64::from(MILLI);
    (MAX_SCORE as f64 / (1.0 + (-x).exp())) as i64
}

impl Policy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        let n = &cluster.nodes[node];
        let old = match self.frag[node] {
            Some(f) => f,
            None => {
                let f = self.workload.node_frag(n);
                self.frag[node] = Some(f);
                f
            }
        };
        let cpu_after = n.cpu_free.saturating_sub(pod.cpu_milli);
        self.scratch.clear();
        self.scratch.extend_from_slice(&n.gpu_free);
        match pod.gpu {
            GpuDemand::None => {
                let new = self.workload.frag_of(n.model, cpu_after, &self.scratch);
                Scored::new(quantise(old, new))
            }
            GpuDemand::Whole(count) => {
                let mut left = count;
                for f in self.scratch.iter_mut() {
                    if left > 0 && *f == MILLI {
                        *f = 0;
                        left -= 1;
                    }
                }
                let new = self.workload.frag_of(n.model, cpu_after, &self.scratch);
                Scored::new(quantise(old, new))
            }
            GpuDemand::Share(m) => {
                let mut best: Option<Scored> = None;
                for i in 0..n.gpu_free.len() {
                    let f = n.gpu_free[i];
                    // GPUs with the same free milli give the same result: try the first only.
                    if f < m || n.gpu_free[..i].contains(&f) {
                        continue;
                    }
                    self.scratch[i] = f - m;
                    let new = self.workload.frag_of(n.model, cpu_after, &self.scratch);
                    self.scratch[i] = f;
                    let score = quantise(old, new);
                    if best.is_none_or(|b| score > b.score) {
                        best = Some(Scored {
                            score,
                            share_gpu: Some(i),
                        });
                    }
                }
                best.unwrap_or(Scored::new(0))
            }
        }
    }

    fn placed(&mut self, _cluster: &Cluster, a: &Assignment, _pod: &Pod) {
        if let Some(f) = self.frag.get_mut(a.node) {
            *f = None;
        }
    }
}
