//! Best-fit placement: fill the fullest node that still fits, so whole nodes stay free for
//! large multi-GPU requests, and put shares on GPUs that are already shared.

use std::collections::BTreeMap;

use crate::{GpuSlot, NoFit, Placement, Request};

pub fn place(candidates: &[GpuSlot], request: &Request) -> Result<Placement, NoFit> {
    match *request {
        Request::Whole { count: 0 } | Request::Share { vram_mb: 0 } => Err(NoFit::Empty),
        Request::Whole { count } => place_whole(candidates, count),
        Request::Share { vram_mb } => place_share(candidates, vram_mb),
    }
}

fn free_whole_by_node(candidates: &[GpuSlot]) -> BTreeMap<u32, Vec<usize>> {
    let mut by_node: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, g) in candidates.iter().enumerate() {
        if g.is_whole_free() && g.vram_mb > 0 {
            by_node.entry(g.node).or_default().push(i);
        }
    }
    by_node
}

fn place_whole(candidates: &[GpuSlot], count: u32) -> Result<Placement, NoFit> {
    let wanted = usize::try_from(count).unwrap_or(usize::MAX);
    let by_node = free_whole_by_node(candidates);
    // The node with the fewest free GPUs that hold the request, preferring one where a single
    // switch holds it.
    let best = by_node
        .values()
        .filter(|free| free.len() >= wanted)
        .min_by_key(|free| (!fits_one_switch(candidates, free, wanted), free.len()));
    match best.and_then(|free| pick_whole(candidates, free, wanted)) {
        Some(gpus) => Ok(Placement {
            gpus: gpus
                .into_iter()
                .map(|i| (i, candidates[i].vram_mb))
                .collect(),
        }),
        None => Err(NoFit::NotEnoughOnOneNode {
            wanted: count,
            most_on_one_node: by_node
                .values()
                .map(|v| u32::try_from(v.len()).unwrap_or(u32::MAX))
                .max()
                .unwrap_or(0),
        }),
    }
}

/// `free` (whole-free candidates of one node, in candidate order) by PCIe switch, GPUs of
/// unknown switch together.
fn by_switch(candidates: &[GpuSlot], free: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: BTreeMap<Option<u32>, Vec<usize>> = BTreeMap::new();
    for &i in free {
        groups.entry(candidates[i].switch).or_default().push(i);
    }
    groups.into_values().collect()
}

fn fits_one_switch(candidates: &[GpuSlot], free: &[usize], wanted: usize) -> bool {
    by_switch(candidates, free)
        .iter()
        .any(|g| g.len() >= wanted)
}

/// Which of one node's whole-free GPUs a request for `wanted` gets: all under one switch when
/// one has enough (the one with the fewest free that does, so that emptier switches stay whole
/// for larger requests), else from as few switches as it can (the emptiest first); `None`
/// when the node has fewer than `wanted`.
pub(crate) fn pick_whole(
    candidates: &[GpuSlot],
    free: &[usize],
    wanted: usize,
) -> Option<Vec<usize>> {
    if free.len() < wanted {
        return None;
    }
    let mut groups = by_switch(candidates, free);
    if let Some(one) = groups
        .iter()
        .filter(|g| g.len() >= wanted)
        .min_by_key(|g| (g.len(), g[0]))
    {
        return Some(one[..wanted].to_vec());
    }
    groups.sort_by_key(|g| (std::cmp::Reverse(g.len()), g[0]));
    let mut gpus: Vec<usize> = groups.into_iter().flatten().take(wanted).collect();
    gpus.sort_unstable();
    Some(gpus)
}

fn place_share(candidates: &[GpuSlot], vram_mb: u64) -> Result<Placement, NoFit> {
    let whole_free = free_whole_by_node(candidates);
    // Already-shared GPUs first, the tightest fit among them; then a free GPU on the node with
    // the fewest free GPUs, so that empty nodes stay empty.
    let best = candidates
        .iter()
        .enumerate()
        .filter(|(_, g)| g.free_mb >= vram_mb && g.vram_mb > 0)
        .min_by_key(|(i, g)| {
            let node_free = whole_free.get(&g.node).map_or(0, Vec::len);
            (g.is_whole_free(), g.free_mb, node_free, *i)
        });
    match best {
        Some((i, _)) => Ok(Placement {
            gpus: vec![(i, vram_mb)],
        }),
        None => Err(NoFit::NoShare { wanted_mb: vram_mb }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gpu(node: u32, vram_mb: u64, free_mb: u64) -> GpuSlot {
        GpuSlot {
            node,
            vram_mb,
            free_mb,
            switch: None,
        }
    }

    #[test]
    fn whole_gpus_go_to_the_fullest_node_that_fits() {
        let c = [
            gpu(0, 24, 24),
            gpu(0, 24, 24),
            gpu(0, 24, 24),
            gpu(0, 24, 24),
            gpu(1, 24, 0),
            gpu(1, 24, 24),
            gpu(1, 24, 24),
        ];
        assert_eq!(
            place(&c, &Request::Whole { count: 2 }),
            Ok(Placement {
                gpus: vec![(5, 24), (6, 24)]
            })
        );
        assert_eq!(
            place(&c, &Request::Whole { count: 3 }).map(|p| p.gpus[0].0),
            Ok(0)
        );
        assert_eq!(
            place(&c, &Request::Whole { count: 5 }),
            Err(NoFit::NotEnoughOnOneNode {
                wanted: 5,
                most_on_one_node: 4
            })
        );
    }

    #[test]
    fn shares_fill_shared_gpus_first() {
        let c = [gpu(0, 24, 24), gpu(1, 24, 10), gpu(1, 24, 6)];
        assert_eq!(
            place(&c, &Request::Share { vram_mb: 8 }),
            Ok(Placement { gpus: vec![(1, 8)] })
        );
        assert_eq!(
            place(&c, &Request::Share { vram_mb: 5 }),
            Ok(Placement { gpus: vec![(2, 5)] })
        );
        assert_eq!(
            place(&c, &Request::Share { vram_mb: 12 }),
            Ok(Placement {
                gpus: vec![(0, 12)]
            })
        );
        assert_eq!(
            place(&c, &Request::Share { vram_mb: 25 }),
            Err(NoFit::NoShare { wanted_mb: 25 })
        );
        assert_eq!(place(&c, &Request::Whole { count: 0 }), Err(NoFit::Empty));
    }

    /// Eight GPUs of 24 GB on one node under two switches (0-3, 4-7), `busy` taken.
    fn two_switches(node: u32, busy: &[usize]) -> Vec<GpuSlot> {
        (0..8)
            .map(|i| GpuSlot {
                switch: Some(u32::from(i >= 4)),
                ..gpu(node, 24, if busy.contains(&i) { 0 } else { 24 })
            })
            .collect()
    }

    fn taken(c: &[GpuSlot], count: u32) -> Vec<usize> {
        place(c, &Request::Whole { count })
            .unwrap()
            .gpus
            .iter()
            .map(|&(i, _)| i)
            .collect()
    }

    #[test]
    fn whole_gpus_come_from_one_switch() {
        let c = two_switches(0, &[1]);
        // Four fit only under switch 1; two go to switch 0, which has fewer free.
        assert_eq!(taken(&c, 4), [4, 5, 6, 7]);
        assert_eq!(taken(&c, 2), [0, 2]);
        // Six span both switches, as few GPUs as possible outside the emptiest one.
        assert_eq!(taken(&c, 6), [0, 2, 4, 5, 6, 7]);
    }

    #[test]
    fn a_node_that_holds_the_request_under_one_switch_wins() {
        // Node 0 has 4 free over two switches (2 + 2); node 1 has 6 (4 + 2): best fit by count
        // alone would split the request on node 0.
        let mut c = two_switches(0, &[0, 1, 4, 5]);
        c.extend(two_switches(1, &[0, 1]));
        assert_eq!(taken(&c, 4), [12, 13, 14, 15]);
        // Unknown topology: as before, the node with the fewest free.
        let unknown: Vec<GpuSlot> = c.iter().map(|g| GpuSlot { switch: None, ..*g }).collect();
        assert_eq!(taken(&unknown, 4), [2, 3, 6, 7]);
    }

    fn cluster() -> impl Strategy<Value = Vec<GpuSlot>> {
        proptest::collection::vec(
            (0u32..6, 1u64..8, 0u64..=8, proptest::option::of(0u32..3)),
            0..40,
        )
        .prop_map(|v| {
            v.into_iter()
                .map(|(node, vram, free, switch)| {
                    let vram = vram * 1024;
                    GpuSlot {
                        switch,
                        ..gpu(node, vram, (free * 1024).min(vram))
                    }
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn placements_only_take_what_is_free(c in cluster(), count in 1u32..6, share in 1u64..9000) {
            if let Ok(p) = place(&c, &Request::Whole { count }) {
                prop_assert_eq!(p.gpus.len(), count as usize);
                let node = c[p.gpus[0].0].node;
                let mut seen = std::collections::BTreeSet::new();
                for (i, mb) in &p.gpus {
                    prop_assert!(seen.insert(*i), "a GPU given twice");
                    prop_assert!(c[*i].is_whole_free());
                    prop_assert_eq!(c[*i].node, node, "a gang split across nodes");
                    prop_assert_eq!(*mb, c[*i].vram_mb);
                }
                // Under one switch whenever one switch of the node had enough.
                let free = &free_whole_by_node(&c)[&node];
                if fits_one_switch(&c, free, count as usize) {
                    let first = c[p.gpus[0].0].switch;
                    prop_assert!(p.gpus.iter().all(|&(i, _)| c[i].switch == first));
                }
            } else {
                let most = free_whole_by_node(&c).values().map(Vec::len).max().unwrap_or(0);
                prop_assert!(most < count as usize);
            }
            match place(&c, &Request::Share { vram_mb: share }) {
                Ok(p) => {
                    prop_assert_eq!(p.gpus.len(), 1);
                    prop_assert!(c[p.gpus[0].0].free_mb >= share);
                }
                Err(_) => prop_assert!(c.iter().all(|g| g.free_mb < share)),
            }
        }
    }
}
