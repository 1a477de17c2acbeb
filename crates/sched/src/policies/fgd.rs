//! Fragmentation gradient descent (FGD, Weng et al., ATC'23): the node, and for a share the GPU,
//! where placing the pod increases the expected fragmentation least.
//!
//! A node's score for a pod depends only on the node's free CPU and GPUs and on the pod's CPU and
//! GPU request, so each node keeps its current fragmentation and the scores it has computed, by
//! request, for as long as its free resources stay as they were. Between two placements only one
//! node changes, so a request seen before is scored afresh only on the nodes that changed since.

use std::collections::HashMap;

use super::{Policy, Scored, MAX_SCORE};
use crate::cluster::{Assignment, Cluster, GpuDemand, Node, Pod, MILLI};
use crate::workload::Workload;

/// What a node's score depends on of the pod (memory and the model constraint only decide
/// whether it fits).
type Request = (u64, GpuDemand);

#[derive(Debug, Clone)]
pub struct Fgd {
    workload: Workload,
    nodes: Vec<NodeCache>,
    /// A small index for each request seen, into [`NodeCache::scores`].
    requests: HashMap<Request, usize>,
    /// The last request looked up, as the same pod is scored on every node in turn.
    last: Option<(Request, usize)>,
    scratch: Vec<u32>,
}

/// What was computed for a node while its free resources were `cpu_free` and `gpu_free`.
#[derive(Debug, Clone, Default)]
struct NodeCache {
    cpu_free: u64,
    gpu_free: Vec<u32>,
    /// The node's fragmentation; `None` until computed or after the node changed.
    frag: Option<f64>,
    /// Scores by request index; `None` where not computed yet.
    scores: Vec<Option<Scored>>,
}

impl Fgd {
    pub fn new(workload: Workload, nodes: usize) -> Self {
        Fgd {
            workload,
            nodes: vec![NodeCache::default(); nodes],
            requests: HashMap::new(),
            last: None,
            scratch: Vec::new(),
        }
    }

    fn request_index(&mut self, pod: &Pod) -> usize {
        let request = (pod.cpu_milli, pod.gpu);
        if let Some((r, i)) = self.last {
            if r == request {
                return i;
            }
        }
        let next = self.requests.len();
        let i = *self.requests.entry(request).or_insert(next);
        self.last = Some((request, i));
        i
    }
}

/// The reference squashes the fragmentation decrease (in GPUs) through a sigmoid into the
/// integer range 0..=100; the rounding makes near-equal nodes tie (see `TieBreak`).
#[allow(clippy::cast_possible_truncation)]
fn quantise(old: f64, new: f64) -> i64 {
    let x = (old - new) / f64::from(MILLI);
    (MAX_SCORE as f64 / (1.0 + (-x).exp())) as i64
}

/// The node's score for the pod, given its current fragmentation `old`.
fn score_afresh(
    workload: &Workload,
    scratch: &mut Vec<u32>,
    n: &Node,
    pod: &Pod,
    old: f64,
) -> Scored {
    let cpu_after = n.cpu_free.saturating_sub(pod.cpu_milli);
    scratch.clear();
    scratch.extend_from_slice(&n.gpu_free);
    match pod.gpu {
        GpuDemand::None => {
            let new = workload.frag_of(n.model, cpu_after, scratch);
            Scored::new(quantise(old, new))
        }
        GpuDemand::Whole(count) => {
            let mut left = count;
            for f in scratch.iter_mut() {
                if left > 0 && *f == MILLI {
                    *f = 0;
                    left -= 1;
                }
            }
            let new = workload.frag_of(n.model, cpu_after, scratch);
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
                scratch[i] = f - m;
                let new = workload.frag_of(n.model, cpu_after, scratch);
                scratch[i] = f;
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

impl Policy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        let n = &cluster.nodes[node];
        let request = self.request_index(pod);
        if node >= self.nodes.len() {
            self.nodes.resize_with(node + 1, NodeCache::default);
        }
        let c = &mut self.nodes[node];
        // Whatever changed the node (a placement or a release), its old results no longer hold.
        let old = match c.frag {
            Some(f) if c.cpu_free == n.cpu_free && c.gpu_free == n.gpu_free => f,
            _ => {
                let f = self.workload.node_frag(n);
                c.cpu_free = n.cpu_free;
                c.gpu_free.clone_from(&n.gpu_free);
                c.frag = Some(f);
                c.scores.clear();
                f
            }
        };
        if let Some(Some(s)) = c.scores.get(request) {
            return *s;
        }
        let s = score_afresh(&self.workload, &mut self.scratch, n, pod, old);
        if c.scores.len() <= request {
            c.scores.resize(request + 1, None);
        }
        c.scores[request] = Some(s);
        s
    }

    fn placed(&mut self, _cluster: &Cluster, a: &Assignment, _pod: &Pod) {
        if let Some(c) = self.nodes.get_mut(a.node) {
            c.frag = None;
        }
    }
}
