//! Choosing spot instances to preempt when higher-priority work cannot fit: on one node, the
//! cheapest set of lower-priority victims whose GPU memory, once freed, lets the request fit.

use std::collections::BTreeMap;

use crate::{place, GpuSlot, Request};

/// A running instance that may be preempted: what it holds and what it is worth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// Its bid per whole GPU-hour: only work of higher priority may preempt it.
    pub priority: i64,
    /// What preempting it loses, per hour (its price per hour).
    pub value: i64,
    /// Newer instances lose less finished work; among equals the newest goes first.
    pub started_at: i64,
    /// (index into the GPU slice, MiB it holds there).
    pub holds: Vec<(usize, u64)>,
}

/// The victims (indices into `victims`) to preempt so that `request`, of priority
/// `priority`, fits on one node, losing the least value per hour; `None` when no set of
/// lower-priority victims makes room. Only victims on the node chosen are returned.
pub fn choose_victims(
    gpus: &[GpuSlot],
    victims: &[Victim],
    request: &Request,
    priority: i64,
) -> Option<Vec<usize>> {
    let mut by_node: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, v) in victims.iter().enumerate() {
        if v.priority >= priority {
            continue;
        }
        let Some(node) = v
            .holds
            .first()
            .and_then(|&(g, _)| gpus.get(g))
            .map(|g| g.node)
        else {
            continue;
        };
        // Every GPU a victim holds must be on that one node.
        if v.holds
            .iter()
            .all(|&(g, _)| gpus.get(g).is_some_and(|s| s.node == node))
        {
            by_node.entry(node).or_default().push(i);
        }
    }
    let mut best: Option<(i64, Vec<usize>)> = None;
    for (node, mut candidates) in by_node {
        let node_gpus: Vec<usize> = (0..gpus.len()).filter(|&g| gpus[g].node == node).collect();
        // The lowest bids first, then the newest.
        candidates.sort_by_key(|&i| {
            (
                victims[i].priority,
                std::cmp::Reverse(victims[i].started_at),
                i,
            )
        });
        let mut chosen = Vec::new();
        let mut fits = false;
        for &v in &candidates {
            chosen.push(v);
            if fits_after(gpus, &node_gpus, victims, &chosen, request) {
                fits = true;
                break;
            }
        }
        if !fits {
            continue;
        }
        // Spare whoever turned out not to be needed, the most valuable first.
        let mut order = chosen.clone();
        order.sort_by_key(|&i| std::cmp::Reverse((victims[i].value, victims[i].priority)));
        for v in order {
            let without: Vec<usize> = chosen.iter().copied().filter(|&c| c != v).collect();
            if fits_after(gpus, &node_gpus, victims, &without, request) {
                chosen = without;
            }
        }
        let loss: i64 = chosen
            .iter()
            .map(|&i| victims[i].value)
            .fold(0, i64::saturating_add);
        if best.as_ref().is_none_or(|(l, _)| loss < *l) {
            chosen.sort_unstable();
            best = Some((loss, chosen));
        }
    }
    best.map(|(_, v)| v)
}

/// Whether the request fits on the node once `chosen` victims' memory is freed.
fn fits_after(
    gpus: &[GpuSlot],
    node_gpus: &[usize],
    victims: &[Victim],
    chosen: &[usize],
    request: &Request,
) -> bool {
    let mut slots: Vec<GpuSlot> = node_gpus.iter().map(|&g| gpus[g]).collect();
    for &v in chosen {
        for &(g, mb) in &victims[v].holds {
            if let Some(pos) = node_gpus.iter().position(|&n| n == g) {
                let s = &mut slots[pos];
                s.free_mb = s.free_mb.saturating_add(mb).min(s.vram_mb);
            }
        }
    }
    place(&slots, request).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gpu(node: u32, free_mb: u64) -> GpuSlot {
        GpuSlot {
            node,
            vram_mb: 1000,
            free_mb,
            switch: None,
        }
    }

    fn victim(priority: i64, value: i64, holds: Vec<(usize, u64)>) -> Victim {
        Victim {
            priority,
            value,
            started_at: 0,
            holds,
        }
    }

    #[test]
    fn the_cheapest_node_and_only_the_needed_victims() {
        // Node 0: two GPUs held by spot bids of 5 and 1; node 1: one GPU held by a bid of 2
        // and one free.
        let gpus = [gpu(0, 0), gpu(0, 0), gpu(1, 0), gpu(1, 1000)];
        let victims = [
            victim(5, 5, vec![(0, 1000)]),
            victim(1, 1, vec![(1, 1000)]),
            victim(2, 2, vec![(2, 1000)]),
        ];
        let one = Request::Whole { count: 1 };
        // One GPU is free already on node 1, but the caller asks only when nothing fits; with
        // that free GPU node 1 needs no victim at all.
        assert_eq!(
            choose_victims(&gpus, &victims, &one, i64::MAX),
            Some(vec![])
        );
        let two = Request::Whole { count: 2 };
        assert_eq!(
            choose_victims(&gpus, &victims, &two, i64::MAX),
            Some(vec![2])
        );
        // A spot bid of 3 may only preempt bids below 3.
        let three = Request::Whole { count: 3 };
        assert_eq!(choose_victims(&gpus, &victims, &three, 3), None);
        // A bid of 2 may preempt only the bid of 1, which frees a GPU next to a busy one: no
        // room for two on one node.
        assert_eq!(choose_victims(&gpus, &victims, &two, 2), None);
    }

    #[test]
    fn equal_bids_do_not_preempt() {
        let gpus = [gpu(0, 0)];
        let victims = [victim(4, 4, vec![(0, 1000)])];
        assert_eq!(
            choose_victims(&gpus, &victims, &Request::Whole { count: 1 }, 4),
            None
        );
        assert_eq!(
            choose_victims(&gpus, &victims, &Request::Whole { count: 1 }, 5),
            Some(vec![0])
        );
    }

    proptest! {
        /// Whatever is chosen: all of lower priority, all on one node, and the request fits
        /// once they are gone.
        #[test]
        fn victims_are_lower_priority_and_make_room(
            frees in proptest::collection::vec((0u32..3, 0u64..=1000), 1..12),
            raw in proptest::collection::vec((0i64..10, 0usize..12, 1u64..=1000), 0..10),
            want in 1u32..4,
            priority in 0i64..12,
        ) {
            let gpus: Vec<GpuSlot> = frees.iter().map(|&(n, f)| gpu(n, f)).collect();
            let victims: Vec<Victim> = raw
                .iter()
                .map(|&(p, g, mb)| victim(p, p, vec![(g % gpus.len(), mb)]))
                .collect();
            let request = Request::Whole { count: want };
            if let Some(chosen) = choose_victims(&gpus, &victims, &request, priority) {
                prop_assert!(chosen.iter().all(|&v| victims[v].priority < priority));
                let nodes: std::collections::BTreeSet<u32> =
                    chosen.iter().map(|&v| gpus[victims[v].holds[0].0].node).collect();
                prop_assert!(nodes.len() <= 1);
                let mut after = gpus.clone();
                for &v in &chosen {
                    for &(g, mb) in &victims[v].holds {
                        after[g].free_mb = (after[g].free_mb + mb).min(after[g].vram_mb);
                    }
                }
                prop_assert!(place(&after, &request).is_ok());
            }
        }
    }
}
