//! GPU clustering: put pods of the same kind (share, 1, 2, 4, 8 GPUs...) together, preferring
//! nodes that hold only that kind, then mixed nodes with it, then idle nodes, then others.

use super::{Policy, Scored, MAX_SCORE, MAX_SPEC_GPU};
use crate::cluster::{Assignment, Cluster, GpuDemand, Pod};

/// Per node, how many pods of each kind it holds.
#[derive(Debug, Clone)]
pub struct GpuClustering {
    kinds: Vec<Vec<(GpuDemand, u32)>>,
}

impl GpuClustering {
    pub fn new(nodes: usize) -> Self {
        GpuClustering {
            kinds: vec![Vec::new(); nodes],
        }
    }
}

/// The affinity tag: shares of any size are one kind, whole GPUs one kind per count.
fn kind(gpu: GpuDemand) -> GpuDemand {
    match gpu {
        GpuDemand::Share(_) => GpuDemand::Share(0),
        other => other,
    }
}

impl Policy for GpuClustering {
    fn name(&self) -> &'static str {
        "gpu-clustering"
    }

    #[allow(clippy::cast_possible_truncation)] // free milli of one node is far below i64::MAX
    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        if pod.gpu == GpuDemand::None {
            return Scored::new(0);
        }
        let tags = &self.kinds[node];
        let fill = MAX_SCORE / 4
            * (MAX_SPEC_GPU as i64 - cluster.nodes[node].gpu_free_total() as i64)
            / MAX_SPEC_GPU as i64;
        let mine = kind(pod.gpu);
        let has_mine = tags.iter().any(|&(k, c)| k == mine && c > 0);
        let band = match (has_mine, tags.len()) {
            (true, 1) => 3,
            (true, _) => 2,
            (false, 0) => 1,
            (false, _) => 0,
        };
        Scored::new(fill + MAX_SCORE * band / 4)
    }

    fn placed(&mut self, _cluster: &Cluster, a: &Assignment, pod: &Pod) {
        if pod.gpu == GpuDemand::None {
            return;
        }
        let tags = &mut self.kinds[a.node];
        let mine = kind(pod.gpu);
        match tags.iter_mut().find(|(k, _)| *k == mine) {
            Some((_, c)) => *c += 1,
            None => tags.push((mine, 1)),
        }
    }

    fn released(&mut self, _cluster: &Cluster, a: &Assignment, pod: &Pod) {
        if pod.gpu == GpuDemand::None {
            return;
        }
        let tags = &mut self.kinds[a.node];
        let mine = kind(pod.gpu);
        if let Some(at) = tags.iter().position(|(k, _)| *k == mine) {
            tags[at].1 = tags[at].1.saturating_sub(1);
            // The band counts the kinds a node holds, so a kind with no pod left must go.
            if tags[at].1 == 0 {
                tags.remove(at);
            }
        }
    }
}
