//! The target workload (how often each request shape is expected) and the fragmentation it
//! implies: the GPU milli of a node that an expected request could not use (FGD, Weng et al.).

use std::collections::HashMap;

use crate::cluster::{Cluster, GpuDemand, ModelSet, Node, Pod};

/// A request shape of the workload; memory is not part of it, as in the paper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub cpu_milli: u64,
    pub gpu: GpuDemand,
    pub models: ModelSet,
}

/// Shapes with their expected share of arrivals, summing to 1.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub shapes: Vec<(Shape, f64)>,
}

impl Workload {
    /// The most popular shapes of the pod list, added one at a time in decreasing count until
    /// they cover `popularity` (0..=1) of the pods, then renormalised; this is the reference
    /// simulator's setting in the paper's experiments (CPU-only pods included, 95%, step 1).
    pub fn from_pods(pods: &[Pod], popularity: f64) -> Self {
        let mut counts: HashMap<Shape, u64> = HashMap::new();
        for p in pods {
            let shape = Shape {
                cpu_milli: p.cpu_milli,
                gpu: p.gpu,
                models: p.models,
            };
            *counts.entry(shape).or_default() += 1;
        }
        let total: u64 = counts.values().sum();
        let mut list: Vec<(Shape, u64)> = counts.into_iter().collect();
        // Most frequent first; ties in a fixed order so the result does not depend on hashing.
        list.sort_by(|(a, ca), (b, cb)| {
            cb.cmp(ca).then_with(|| {
                (
                    b.cpu_milli,
                    b.gpu.per_gpu_milli(),
                    b.gpu.gpu_count(),
                    b.models,
                )
                    .cmp(&(
                        a.cpu_milli,
                        a.gpu.per_gpu_milli(),
                        a.gpu.gpu_count(),
                        a.models,
                    ))
            })
        });
        let wanted = popularity * total as f64;
        let mut covered = 0u64;
        let mut kept = Vec::new();
        for (shape, count) in list {
            if kept.is_empty() || (covered as f64) < wanted {
                covered += count;
                kept.push((shape, count));
            } else {
                break;
            }
        }
        let shapes = kept
            .into_iter()
            .map(|(s, c)| (s, c as f64 / covered as f64))
            .collect();
        Workload { shapes }
    }

    /// The node's fragmentation: for each expected shape, weighted by its share, the free GPU
    /// milli that shape could not use on this node as it is now.
    pub fn node_frag(&self, node: &Node) -> f64 {
        self.frag_of(node.model, node.cpu_free, &node.gpu_free)
    }

    /// [`Workload::node_frag`] on a node state given by parts (for what-if evaluations).
    pub fn frag_of(&self, model: Option<u8>, cpu_free: u64, gpu_free: &[u32]) -> f64 {
        let free_total: u64 = gpu_free.iter().map(|&m| u64::from(m)).sum();
        if free_total == 0 {
            return 0.0;
        }
        let free_total = free_total as f64;
        let mut frag = 0.0;
        for (shape, share) in &self.shapes {
            frag += share * shape_frag(shape, model, cpu_free, gpu_free, free_total);
        }
        frag
    }

    /// Fragmented GPU milli of the whole cluster.
    pub fn cluster_frag(&self, cluster: &Cluster) -> f64 {
        cluster.nodes.iter().map(|n| self.node_frag(n)).sum()
    }
}

fn shape_frag(
    shape: &Shape,
    model: Option<u8>,
    cpu_free: u64,
    gpu_free: &[u32],
    total: f64,
) -> f64 {
    let per_gpu = shape.gpu.per_gpu_milli();
    // A CPU-only shape can use no GPU: to it all free GPU is fragment.
    if per_gpu == 0 {
        return total;
    }
    let accessible = match (shape.models, model) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(mask), Some(m)) => mask & (1u64 << m) != 0,
    };
    if !accessible || cpu_free < shape.cpu_milli {
        return total;
    }
    let usable = gpu_free.iter().filter(|&&f| f >= per_gpu).count();
    if (usable as u64) < u64::from(shape.gpu.gpu_count()) {
        return total;
    }
    // The shape fits: only the GPUs too small for it are fragment.
    gpu_free
        .iter()
        .filter(|&&f| f < per_gpu)
        .map(|&f| f64::from(f))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::MILLI;

    fn pod(cpu: u64, gpu: GpuDemand) -> Pod {
        Pod {
            cpu_milli: cpu,
            memory_mib: 0,
            gpu,
            models: None,
        }
    }

    #[test]
    fn popular_shapes_renormalised() {
        let mut pods = vec![pod(1000, GpuDemand::Share(500)); 6];
        pods.extend(vec![pod(2000, GpuDemand::Whole(1)); 3]);
        pods.push(pod(4000, GpuDemand::Whole(8)));
        let w = Workload::from_pods(&pods, 0.9);
        assert_eq!(w.shapes.len(), 2);
        assert!((w.shapes[0].1 - 6.0 / 9.0).abs() < 1e-9);
        let all = Workload::from_pods(&pods, 1.0);
        assert_eq!(all.shapes.len(), 3);
    }

    #[test]
    fn fragmentation_of_a_node() {
        let w = Workload {
            shapes: vec![
                (
                    Shape {
                        cpu_milli: 1000,
                        gpu: GpuDemand::Share(500),
                        models: None,
                    },
                    0.5,
                ),
                (
                    Shape {
                        cpu_milli: 1000,
                        gpu: GpuDemand::Whole(1),
                        models: None,
                    },
                    0.5,
                ),
            ],
        };
        // Free: one whole GPU and one with 300: the share cannot use the 300 (frag 300);
        // the whole-GPU request cannot use it either (300).
        assert!((w.frag_of(Some(0), 8000, &[MILLI, 300]) - 300.0).abs() < 1e-9);
        // 400 and 300 free: nothing fits a whole GPU (700), the share neither (700).
        assert!((w.frag_of(Some(0), 8000, &[400, 300]) - 700.0).abs() < 1e-9);
        // No CPU left: everything is fragment.
        assert!((w.frag_of(Some(0), 0, &[MILLI, MILLI]) - 2000.0).abs() < 1e-9);
        assert_eq!(w.frag_of(Some(0), 8000, &[0, 0]), 0.0);
    }
}
