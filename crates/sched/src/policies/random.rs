//! Random fit: any node that fits, uniformly (every node scores the same, so the tie-break draws).

use super::{Policy, Scored};
use crate::cluster::{Cluster, Pod};

#[derive(Debug, Clone, Copy, Default)]
pub struct RandomFit;

impl Policy for RandomFit {
    fn name(&self) -> &'static str {
        "random"
    }

    fn score(&mut self, _cluster: &Cluster, _node: usize, _pod: &Pod) -> Scored {
        Scored::new(0)
    }

    fn random_ties(&self) -> bool {
        true
    }
}
