//! Placement policies of the simulator: each scores the nodes that fit a pod, and the pod goes to
//! the best-scored node; equal best scores are broken either at random (stock kube-scheduler) or
//! by a fixed node order (the reference simulator, see [`TieBreak`]).

mod best_fit;
mod clustering;
mod dot_product;
mod fgd;
mod fgd_cpu;
mod packing;
mod random;
mod vram_weighted;

pub use best_fit::BestFit;
pub use clustering::GpuClustering;
pub use dot_product::DotProduct;
pub use fgd::Fgd;
pub use fgd_cpu::FgdCpu;
pub use packing::GpuPacking;
pub use random::RandomFit;
pub use vram_weighted::VramWeighted;

use crate::cluster::{Assignment, Cluster, GpuDemand, Pod};
use crate::rng::SimRng;
use crate::workload::Workload;

/// Kube-scheduler's score range, which the reference policies quantise to.
pub const MAX_SCORE: i64 = 100;
/// Normalisation constants of the reference simulator: the largest node of the trace.
pub const MAX_SPEC_CPU: f64 = 128_000.0;
pub const MAX_SPEC_GPU: f64 = 8_000.0;

/// A node's score for a pod, and for a share the GPU the policy would use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scored {
    pub score: i64,
    pub share_gpu: Option<usize>,
}

impl Scored {
    pub fn new(score: i64) -> Self {
        Scored {
            score,
            share_gpu: None,
        }
    }
}

pub trait Policy: std::fmt::Debug {
    fn name(&self) -> &'static str;

    /// Scores a node that fits the pod (higher is better).
    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored;

    /// Told after each allocation, for policies that keep state per node.
    fn placed(&mut self, _cluster: &Cluster, _assignment: &Assignment, _pod: &Pod) {}

    /// Told after a pod placed earlier has left and its resources are free again (the trace
    /// replay's departures), for policies that keep state per node.
    fn released(&mut self, _cluster: &Cluster, _assignment: &Assignment, _pod: &Pod) {}

    /// Whether equal scores must be broken at random whatever the experiment's rule (random fit,
    /// whose scores are all equal and which would otherwise become first fit).
    fn random_ties(&self) -> bool {
        false
    }
}

/// How equal best scores are broken.
#[derive(Debug, Clone, Copy)]
pub enum TieBreak<'a> {
    /// Uniformly at random, as stock kube-scheduler's host selection does.
    Random,
    /// The node of lowest rank (`rank[node]`) wins. The reference simulator of the FGD paper
    /// names its nodes after a seeded permutation and its scheduler (a modified kube-scheduler)
    /// breaks ties by that order, not at random; the paper's figures for the policies whose
    /// scores tie often (FGD, GPU packing, GPU clustering) are only reproduced this way.
    Ranked(&'a [u32]),
}

/// The policy names `by_name` knows, in the order the paper lists them, then the seeds' own and
/// ours.
pub const NAMES: [&str; 8] = [
    "random",
    "dot-product",
    "gpu-clustering",
    "gpu-packing",
    "best-fit",
    "fgd",
    "vram-weighted",
    "fgd-cpu",
];

/// A fresh policy by name; `workload` is the expected workload FGD measures fragmentation with.
pub fn by_name(name: &str, workload: &Workload, nodes: usize) -> Option<Box<dyn Policy>> {
    Some(match name {
        "random" => Box::new(RandomFit),
        "dot-product" => Box::new(DotProduct),
        "gpu-clustering" => Box::new(GpuClustering::new(nodes)),
        "gpu-packing" => Box::new(GpuPacking),
        "best-fit" => Box::new(BestFit),
        "fgd" => Box::new(Fgd::new(workload.clone(), nodes)),
        "vram-weighted" => Box::new(VramWeighted::default()),
        "fgd-cpu" => Box::new(FgdCpu::new(workload.clone(), nodes)),
        _ => return None,
    })
}

/// Chooses a node and GPUs for the pod, or `None` when no node fits. Among equal best scores
/// one is drawn uniformly (reservoir sampling), like kube-scheduler's host selection.
pub fn schedule(
    cluster: &Cluster,
    pod: &Pod,
    policy: &mut dyn Policy,
    rng: &mut SimRng,
) -> Option<Assignment> {
    schedule_with(cluster, pod, policy, rng, TieBreak::Random)
}

/// [`schedule`] with the given rule for equal best scores (random fit always draws).
pub fn schedule_with(
    cluster: &Cluster,
    pod: &Pod,
    policy: &mut dyn Policy,
    rng: &mut SimRng,
    tie_break: TieBreak<'_>,
) -> Option<Assignment> {
    let rank = match tie_break {
        TieBreak::Ranked(rank) if !policy.random_ties() => Some(rank),
        _ => None,
    };
    let mut best: Option<(usize, Scored)> = None;
    let mut ties = 0u64;
    for (i, node) in cluster.nodes.iter().enumerate() {
        if !node.fits(pod) {
            continue;
        }
        let s = policy.score(cluster, i, pod);
        match best {
            Some((_, b)) if s.score < b.score => {}
            Some((b_node, b)) if s.score == b.score => match rank {
                Some(rank) => {
                    let of = |n: usize| rank.get(n).copied().unwrap_or(u32::MAX);
                    if of(i) < of(b_node) {
                        best = Some((i, s));
                    }
                }
                None => {
                    ties += 1;
                    if rng.below(ties) == 0 {
                        best = Some((i, s));
                    }
                }
            },
            _ => {
                best = Some((i, s));
                ties = 1;
            }
        }
    }
    let (i, s) = best?;
    let node = &cluster.nodes[i];
    let gpus = match pod.gpu {
        GpuDemand::None => Vec::new(),
        GpuDemand::Share(m) => vec![s.share_gpu.or_else(|| node.best_fit_gpu(m))?],
        GpuDemand::Whole(n) => node.lowest_free_gpus(n),
    };
    Some(Assignment { node: i, gpus })
}

#[cfg(test)]
mod tests;
