//! The simulator's cluster model: nodes with CPU, memory and GPUs of 1000 milli each, the pods
//! that ask for them, and allocation that keeps every capacity invariant.

use crate::trace::{NodeRow, PodRow};

/// Milli-GPU in one GPU.
pub const MILLI: u32 = 1000;

/// What a pod asks of GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuDemand {
    None,
    /// Part of one GPU, in milli (1..1000).
    Share(u32),
    /// This many whole GPUs on one node.
    Whole(u32),
}

impl GpuDemand {
    pub fn total_milli(self) -> u64 {
        match self {
            GpuDemand::None => 0,
            GpuDemand::Share(m) => u64::from(m),
            GpuDemand::Whole(n) => u64::from(n) * u64::from(MILLI),
        }
    }

    /// Milli asked of each GPU it uses.
    pub fn per_gpu_milli(self) -> u32 {
        match self {
            GpuDemand::None => 0,
            GpuDemand::Share(m) => m,
            GpuDemand::Whole(_) => MILLI,
        }
    }

    pub fn gpu_count(self) -> u32 {
        match self {
            GpuDemand::None => 0,
            GpuDemand::Share(_) => 1,
            GpuDemand::Whole(n) => n,
        }
    }
}

/// A set of allowed GPU models as a bitmask over the cluster's model list; `None` allows any.
pub type ModelSet = Option<u64>;

/// A pod as the simulator places it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: GpuDemand,
    pub models: ModelSet,
}

/// One node and what is still free on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Index into [`Cluster::models`]; `None` for a node without GPUs.
    pub model: Option<u8>,
    pub cpu_free: u64,
    pub memory_free: u64,
    /// Free milli of each GPU, by device index.
    pub gpu_free: Vec<u32>,
}

impl Node {
    pub fn gpu_free_total(&self) -> u64 {
        self.gpu_free.iter().map(|&m| u64::from(m)).sum()
    }

    pub fn whole_free(&self) -> u32 {
        let n = self.gpu_free.iter().filter(|&&m| m == MILLI).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Whether the pod's model constraint admits this node (a GPU-less pod goes anywhere).
    pub fn accessible(&self, pod: &Pod) -> bool {
        if pod.gpu == GpuDemand::None {
            return true;
        }
        match (pod.models, self.model) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(mask), Some(m)) => mask & (1u64 << m) != 0,
        }
    }

    /// Whether the pod fits here now: model, CPU, memory and GPUs.
    pub fn fits(&self, pod: &Pod) -> bool {
        self.accessible(pod)
            && self.cpu_free >= pod.cpu_milli
            && self.memory_free >= pod.memory_mib
            && match pod.gpu {
                GpuDemand::None => true,
                GpuDemand::Share(m) => self.gpu_free.iter().any(|&f| f >= m),
                GpuDemand::Whole(n) => self.whole_free() >= n,
            }
    }

    /// The lowest-indexed fully free GPUs, as many as a whole-GPU pod asks for.
    pub fn lowest_free_gpus(&self, count: u32) -> Vec<usize> {
        self.gpu_free
            .iter()
            .enumerate()
            .filter(|(_, &f)| f == MILLI)
            .map(|(i, _)| i)
            .take(usize::try_from(count).unwrap_or(usize::MAX))
            .collect()
    }

    /// The fullest GPU that still has room for a share (first by index on a tie).
    pub fn best_fit_gpu(&self, milli: u32) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, &f) in self.gpu_free.iter().enumerate() {
            if f >= milli && best.is_none_or(|b| f < self.gpu_free[b]) {
                best = Some(i);
            }
        }
        best
    }
}

/// Where a pod went: a node and the GPU indices on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub node: usize,
    pub gpus: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("node `{node}` has {gpus} GPUs, more than the model supports")]
    TooManyGpus { node: String, gpus: u32 },
    #[error("the cluster has more than 64 GPU models")]
    TooManyModels,
    #[error("no node {node}")]
    NoNode { node: usize },
    #[error("node `{node}`: {reason}")]
    DoesNotFit { node: String, reason: &'static str },
    #[error("node `{node}`: invariant broken: {reason}")]
    Invariant { node: String, reason: &'static str },
}

/// The nodes and the GPU models they use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub models: Vec<String>,
}

impl Cluster {
    pub fn from_rows(rows: &[NodeRow]) -> Result<Self, ClusterError> {
        let mut models: Vec<String> = Vec::new();
        let mut nodes = Vec::with_capacity(rows.len());
        for r in rows {
            // 64 GPUs is far above any node of the trace; it bounds per-node work.
            if r.gpus > 64 {
                return Err(ClusterError::TooManyGpus {
                    node: r.name.clone(),
                    gpus: r.gpus,
                });
            }
            let model = match (&r.model, r.gpus) {
                (Some(m), g) if g > 0 => {
                    let i = match models.iter().position(|x| x == m) {
                        Some(i) => i,
                        None => {
                            models.push(m.clone());
                            models.len() - 1
                        }
                    };
                    Some(u8::try_from(i).map_err(|_| ClusterError::TooManyModels)?)
                }
                _ => None,
            };
            if models.len() > 64 {
                return Err(ClusterError::TooManyModels);
            }
            nodes.push(Node {
                name: r.name.clone(),
                cpu_milli: r.cpu_milli,
                memory_mib: r.memory_mib,
                model,
                cpu_free: r.cpu_milli,
                memory_free: r.memory_mib,
                gpu_free: vec![MILLI; r.gpus as usize],
            });
        }
        Ok(Cluster { nodes, models })
    }

    /// The pod of a trace row, its model names mapped onto this cluster's models (a model no
    /// node has simply matches no node).
    pub fn pod(&self, row: &PodRow) -> Pod {
        let gpu = match (row.num_gpu, row.gpu_milli) {
            (0, _) => GpuDemand::None,
            (1, m) if m < MILLI => GpuDemand::Share(m),
            (n, _) => GpuDemand::Whole(n),
        };
        let models = if row.gpu_spec.is_empty() {
            None
        } else {
            Some(
                row.gpu_spec
                    .iter()
                    .filter_map(|s| self.models.iter().position(|m| m == s))
                    .fold(0u64, |mask, i| mask | (1u64 << i)),
            )
        };
        Pod {
            cpu_milli: row.cpu_milli,
            memory_mib: row.memory_mib,
            gpu,
            models,
        }
    }

    pub fn gpu_capacity_milli(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.gpu_free.len() as u64 * u64::from(MILLI))
            .sum()
    }

    pub fn gpu_allocated_milli(&self) -> u64 {
        self.gpu_capacity_milli() - self.nodes.iter().map(Node::gpu_free_total).sum::<u64>()
    }

    /// Takes the pod's resources on the assignment's node and GPUs, or changes nothing and
    /// says why not.
    pub fn allocate(&mut self, pod: &Pod, a: &Assignment) -> Result<(), ClusterError> {
        let node = self
            .nodes
            .get_mut(a.node)
            .ok_or(ClusterError::NoNode { node: a.node })?;
        let no = |reason| ClusterError::DoesNotFit {
            node: node.name.clone(),
            reason,
        };
        if !node.accessible(pod) {
            return Err(no("the GPU model is not one the pod allows"));
        }
        if node.cpu_free < pod.cpu_milli || node.memory_free < pod.memory_mib {
            return Err(no("not enough CPU or memory"));
        }
        if a.gpus.len() != pod.gpu.gpu_count() as usize {
            return Err(no("the number of GPUs differs from the request"));
        }
        let per_gpu = pod.gpu.per_gpu_milli();
        for (k, &g) in a.gpus.iter().enumerate() {
            if a.gpus[..k].contains(&g) {
                return Err(no("a GPU is named twice"));
            }
            match node.gpu_free.get(g) {
                Some(&f) if f >= per_gpu => {}
                Some(_) => return Err(no("a GPU has not enough free milli")),
                None => return Err(no("no such GPU index")),
            }
        }
        node.cpu_free -= pod.cpu_milli;
        node.memory_free -= pod.memory_mib;
        for &g in &a.gpus {
            node.gpu_free[g] -= per_gpu;
        }
        Ok(())
    }

    /// Gives back what [`Cluster::allocate`] took for the same pod and assignment.
    pub fn release(&mut self, pod: &Pod, a: &Assignment) -> Result<(), ClusterError> {
        let node = self
            .nodes
            .get_mut(a.node)
            .ok_or(ClusterError::NoNode { node: a.node })?;
        let over = |reason| ClusterError::DoesNotFit {
            node: node.name.clone(),
            reason,
        };
        if node.cpu_free + pod.cpu_milli > node.cpu_milli
            || node.memory_free + pod.memory_mib > node.memory_mib
        {
            return Err(over("release of more CPU or memory than is allocated"));
        }
        let per_gpu = pod.gpu.per_gpu_milli();
        for &g in &a.gpus {
            match node.gpu_free.get(g) {
                Some(&f) if f + per_gpu <= MILLI => {}
                _ => return Err(over("release of more GPU than is allocated")),
            }
        }
        node.cpu_free += pod.cpu_milli;
        node.memory_free += pod.memory_mib;
        for &g in &a.gpus {
            node.gpu_free[g] += per_gpu;
        }
        Ok(())
    }

    /// Free never exceeds capacity on any node or GPU.
    pub fn check_invariants(&self) -> Result<(), ClusterError> {
        for n in &self.nodes {
            let broken = |reason| ClusterError::Invariant {
                node: n.name.clone(),
                reason,
            };
            if n.cpu_free > n.cpu_milli {
                return Err(broken("more CPU free than the node has"));
            }
            if n.memory_free > n.memory_mib {
                return Err(broken("more memory free than the node has"));
            }
            if n.gpu_free.iter().any(|&f| f > MILLI) {
                return Err(broken("a GPU with more than 1000 milli free"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn node(name: &str, cpu: u64, gpus: u32, model: &str) -> NodeRow {
        NodeRow {
            name: name.into(),
            cpu_milli: cpu,
            memory_mib: 1 << 20,
            gpus,
            model: (gpus > 0).then(|| model.to_owned()),
        }
    }

    fn pod_row(cpu: u64, num_gpu: u32, gpu_milli: u32, spec: &[&str]) -> PodRow {
        PodRow {
            name: "p".into(),
            cpu_milli: cpu,
            memory_mib: 1,
            num_gpu,
            gpu_milli,
            gpu_spec: spec.iter().map(|s| s.to_string()).collect(),
            creation_time: None,
            deletion_time: None,
        }
    }

    #[test]
    fn allocate_and_release_round_trip() {
        let mut c =
            Cluster::from_rows(&[node("a", 8000, 2, "T4"), node("b", 8000, 0, "")]).unwrap();
        let before = c.clone();
        let share = c.pod(&pod_row(1000, 1, 300, &[]));
        let a = Assignment {
            node: 0,
            gpus: vec![1],
        };
        c.allocate(&share, &a).unwrap();
        assert_eq!(c.nodes[0].gpu_free, vec![1000, 700]);
        assert_eq!(c.gpu_allocated_milli(), 300);
        c.release(&share, &a).unwrap();
        assert_eq!(c, before);
        assert!(c.release(&share, &a).is_err(), "double release");
    }

    #[test]
    fn refuses_what_does_not_fit() {
        let mut c = Cluster::from_rows(&[node("a", 8000, 2, "T4")]).unwrap();
        let whole = c.pod(&pod_row(1000, 2, 1000, &[]));
        let twice = Assignment {
            node: 0,
            gpus: vec![0, 0],
        };
        assert!(c.allocate(&whole, &twice).is_err());
        let v100 = c.pod(&pod_row(1000, 1, 1000, &["V100M32"]));
        assert!(!c.nodes[0].fits(&v100));
        let one = Assignment {
            node: 0,
            gpus: vec![0],
        };
        assert!(c.allocate(&v100, &one).is_err());
        let big_cpu = c.pod(&pod_row(9000, 0, 0, &[]));
        let none = Assignment {
            node: 0,
            gpus: vec![],
        };
        assert!(c.allocate(&big_cpu, &none).is_err());
        assert_eq!(c.gpu_allocated_milli(), 0);
    }

    fn arb_pod() -> impl Strategy<Value = PodRow> {
        (
            0u64..40_000,
            prop_oneof![
                Just((0u32, 0u32)),
                (1u32..1000).prop_map(|m| (1, m)),
                (1u32..=8).prop_map(|n| (n, 1000))
            ],
            prop_oneof![Just(vec![]), Just(vec!["T4"]), Just(vec!["A10", "P100"])],
        )
            .prop_map(|(cpu, (n, m), spec)| pod_row(cpu, n, m, &spec))
    }

    /// A valid assignment of the pod on node `n` if it fits there: for a share, the `pick`th of
    /// the GPUs with room (modulo their number).
    fn fitting(c: &Cluster, n: usize, pod: &Pod, pick: usize) -> Option<Assignment> {
        let node = &c.nodes[n];
        if !node.fits(pod) {
            return None;
        }
        let gpus = match pod.gpu {
            GpuDemand::None => vec![],
            GpuDemand::Share(m) => {
                let room: Vec<usize> = (0..node.gpu_free.len())
                    .filter(|&g| node.gpu_free[g] >= m)
                    .collect();
                vec![room[pick % room.len()]]
            }
            GpuDemand::Whole(k) => node.lowest_free_gpus(k),
        };
        Some(Assignment { node: n, gpus })
    }

    proptest! {
        /// Whatever is asked, with assignments chosen at random: every accepted allocation
        /// keeps the invariants, respects the model, keeps a gang on one node.
        #[test]
        fn allocation_never_breaks_invariants(
            pods in proptest::collection::vec((arb_pod(), 0usize..3, proptest::collection::vec(0usize..9, 0..9)), 1..60)
        ) {
            let mut c = Cluster::from_rows(&[
                node("a", 32_000, 8, "T4"),
                node("b", 16_000, 2, "P100"),
                node("c", 8_000, 0, ""),
            ]).unwrap();
            let mut placed = Vec::new();
            for (row, n, gpus) in pods {
                let pod = c.pod(&row);
                let a = Assignment { node: n, gpus };
                let before = c.clone();
                match c.allocate(&pod, &a) {
                    Ok(()) => {
                        prop_assert!(before.nodes[n].accessible(&pod));
                        prop_assert_eq!(a.gpus.len(), pod.gpu.gpu_count() as usize);
                        placed.push((pod, a));
                    }
                    Err(_) => prop_assert_eq!(&c, &before),
                }
                prop_assert!(c.check_invariants().is_ok());
            }
            for (pod, a) in placed.iter().rev() {
                prop_assert!(c.release(pod, a).is_ok());
            }
            prop_assert_eq!(c.gpu_allocated_milli(), 0);
            prop_assert!(c.nodes.iter().all(|n| n.cpu_free == n.cpu_milli));
        }

        /// On a cluster already partly allocated, releasing a pod right after allocating it
        /// gives back exactly what was taken: the cluster is equal to what it was before.
        #[test]
        fn release_restores_what_allocate_took(
            before in proptest::collection::vec((arb_pod(), 0usize..3, 0usize..8), 0..30),
            row in arb_pod(),
            n in 0usize..3,
            pick in 0usize..8,
        ) {
            let mut c = Cluster::from_rows(&[
                node("a", 32_000, 8, "T4"),
                node("b", 16_000, 2, "P100"),
                node("c", 8_000, 0, ""),
            ]).unwrap();
            for (r, n, pick) in before {
                let pod = c.pod(&r);
                if let Some(a) = fitting(&c, n, &pod, pick) {
                    c.allocate(&pod, &a).unwrap();
                }
            }
            let pod = c.pod(&row);
            let start = c.clone();
            if let Some(a) = fitting(&c, n, &pod, pick) {
                c.allocate(&pod, &a).unwrap();
                prop_assert_ne!(&c, &start);
                c.release(&pod, &a).unwrap();
            }
            prop_assert_eq!(&c, &start);
        }
    }
}
