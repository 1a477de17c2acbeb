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
    let best = by_node
        .values()
        .filter(|free| free.len() >= wanted)
        .min_by_key(|free| free.len());
    match best {
        Some(free) => Ok(Placement {
            gpus: free[..wanted]
                .iter()
                .map(|&i| (i, candidates[i].vram_mb))
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

    fn cluster() -> impl Strategy<Value = Vec<GpuSlot>> {
        proptest::collection::vec((0u32..6, 1u64..8, 0u64..=8), 0..40).prop_map(|v| {
            v.into_iter()
                .map(|(node, vram, free)| {
                    let vram = vram * 1024;
                    gpu(node, vram, (free * 1024).min(vram))
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
