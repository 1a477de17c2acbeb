//! Fragmentation gradient descent (FGD, Weng et al., ATC'23): the node, and for a share the GPU,
//! where placing the pod increases the expected fragmentation least.
//!
//! A node's score for a pod depends only on the node's free CPU and GPUs and on the pod's CPU and
//! GPU request, so each node keeps its current fragmentation and the scores it has computed, by
//! request, for as long as its free resources stay as they were. Between two placements only one
//! node changes, so a request seen before is scored afresh only on the nodes that changed since.

use std::collections::HashMap;

use super::{Policy, Scored, MAX_SCORE};
use crate::cluster::{Assignment, Cluster, GpuDemand, ModelSet, Node, Pod, MILLI};
use crate::workload::Workload;

/// What a node's score depends on of the pod (memory and the model constraint only decide
/// whether it fits).
type Request = (u64, GpuDemand);

#[derive(Debug, Clone)]
pub struct Fgd {
    frag: Frag,
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
            frag: Frag::new(&workload),
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

/// [`Workload::frag_of`] with each shape's terms prepared: the shapes ask for few distinct
/// per-GPU amounts, so what a node's GPUs offer is counted once per amount, not once per shape.
/// The shapes' terms are added in the same order and are the same whole numbers, so the result
/// is the same to the bit.
#[derive(Debug, Clone)]
struct Frag {
    shapes: Vec<ShapeTerm>,
    /// The distinct per-GPU milli the shapes ask for.
    amounts: Vec<u32>,
    /// Per amount, for the node being evaluated: how many GPUs have that much free, and the
    /// free milli of those that have less.
    offer: Vec<(u32, u64)>,
}

/// A shape of the workload as [`Frag`] evaluates it.
#[derive(Debug, Clone, Copy)]
struct ShapeTerm {
    share: f64,
    cpu_milli: u64,
    models: ModelSet,
    /// The GPU count and the index of the per-GPU amount in [`Frag::amounts`]; `None` for a
    /// CPU-only shape, to which all free GPU is fragment.
    gpu: Option<(u32, usize)>,
}

impl Frag {
    fn new(workload: &Workload) -> Self {
        let mut amounts: Vec<u32> = Vec::new();
        let shapes = workload
            .shapes
            .iter()
            .map(|(shape, share)| {
                let per_gpu = shape.gpu.per_gpu_milli();
                let gpu = (per_gpu > 0).then(|| {
                    let i = match amounts.iter().position(|&a| a == per_gpu) {
                        Some(i) => i,
                        None => {
                            amounts.push(per_gpu);
                            amounts.len() - 1
                        }
                    };
                    (shape.gpu.gpu_count(), i)
                });
                ShapeTerm {
                    share: *share,
                    cpu_milli: shape.cpu_milli,
                    models: shape.models,
                    gpu,
                }
            })
            .collect();
        Frag {
            shapes,
            offer: vec![(0, 0); amounts.len()],
            amounts,
        }
    }

    fn of(&mut self, model: Option<u8>, cpu_free: u64, gpu_free: &[u32]) -> f64 {
        let free_total: u64 = gpu_free.iter().map(|&m| u64::from(m)).sum();
        if free_total == 0 {
            return 0.0;
        }
        for (o, &a) in self.offer.iter_mut().zip(&self.amounts) {
            let (mut usable, mut small) = (0u32, 0u64);
            for &f in gpu_free {
                if f >= a {
                    usable += 1;
                } else {
                    small += u64::from(f);
                }
            }
            *o = (usable, small);
        }
        let total = free_total as f64;
        let mut frag = 0.0;
        for s in &self.shapes {
            let accessible = match (s.models, model) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(mask), Some(m)) => mask & (1u64 << m) != 0,
            };
            let term = match s.gpu {
                Some((count, i)) if accessible && cpu_free >= s.cpu_milli => {
                    let (usable, small) = self.offer[i];
                    if usable < count {
                        total
                    } else {
                        small as f64
                    }
                }
                _ => total,
            };
            frag += s.share * term;
        }
        frag
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
fn score_afresh(frag: &mut Frag, scratch: &mut Vec<u32>, n: &Node, pod: &Pod, old: f64) -> Scored {
    let cpu_after = n.cpu_free.saturating_sub(pod.cpu_milli);
    scratch.clear();
    scratch.extend_from_slice(&n.gpu_free);
    match pod.gpu {
        GpuDemand::None => {
            let new = frag.of(n.model, cpu_after, scratch);
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
            let new = frag.of(n.model, cpu_after, scratch);
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
                let new = frag.of(n.model, cpu_after, scratch);
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
                let f = self.frag.of(n.model, n.cpu_free, &n.gpu_free);
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
        let s = score_afresh(&mut self.frag, &mut self.scratch, n, pod, old);
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

    fn released(&mut self, _cluster: &Cluster, a: &Assignment, _pod: &Pod) {
        if let Some(c) = self.nodes.get_mut(a.node) {
            c.frag = None;
        }
    }
}
