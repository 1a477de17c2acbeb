use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

const VRAM: u64 = 24_576;

fn gpu(node: usize, i: usize, free_mb: u64) -> Gpu {
    Gpu {
        node_id: format!("n{node}"),
        uuid: format!("g{node}-{i}"),
        vram_mb: VRAM,
        free_mb,
        switch: None,
    }
}

fn work(id: &str, priority: i64, holds: &[(&str, u64)]) -> Work {
    Work {
        id: id.to_owned(),
        priority,
        value: priority.min(1_000_000),
        started_at: 0,
        ends_at: 3600,
        holds: holds.iter().map(|&(u, mb)| (u.to_owned(), mb)).collect(),
    }
}

#[test]
fn free_memory_first_then_the_cheapest_spot_victim() {
    let view = View {
        gpus: vec![gpu(0, 0, 0), gpu(1, 0, 0)],
        work: vec![
            work("od", ON_DEMAND, &[("g0-0", VRAM)]),
            work("spot", 5, &[("g1-0", VRAM)]),
        ],
    };
    let one = Request::Whole { count: 1 };
    let p = plan(
        &view,
        &Ask {
            request: one,
            priority: ON_DEMAND,
        },
        &[],
    )
    .expect("fits");
    assert_eq!(p.node_id, "n1");
    assert_eq!(p.gpus, vec![("g1-0".to_owned(), VRAM)]);
    assert_eq!(p.victims, vec!["spot".to_owned()]);
    assert!(p.whole);
    // A spot bid preempts only lower bids; reserved work never preempts on-demand.
    assert!(plan(
        &view,
        &Ask {
            request: one,
            priority: 5
        },
        &[]
    )
    .is_err());
    assert_eq!(
        plan(
            &view,
            &Ask {
                request: one,
                priority: 6
            },
            &[]
        )
        .map(|p| p.victims),
        Ok(vec!["spot".to_owned()])
    );
    let mut no_spot = view.clone();
    no_spot.work.pop();
    assert_eq!(
        plan(
            &no_spot,
            &Ask {
                request: one,
                priority: RESERVED
            },
            &[]
        ),
        Err(NoFit::NotEnoughOnOneNode {
            wanted: 1,
            most_on_one_node: 0
        })
    );
}

#[test]
fn tiers_rank_spot_below_on_demand_below_reserved() {
    assert_eq!(tier_priority(Tier::Spot, Some(7), false), 7);
    assert!(is_spot(tier_priority(Tier::Spot, Some(i64::MAX), false)));
    assert_eq!(tier_priority(Tier::OnDemand, None, false), ON_DEMAND);
    assert_eq!(tier_priority(Tier::Stepped, None, false), ON_DEMAND);
    assert_eq!(tier_priority(Tier::Reserved, None, false), RESERVED);
    assert_eq!(tier_priority(Tier::Spot, Some(7), true), RESERVED);
}

#[test]
fn slots_number_nodes_in_order_of_first_appearance() {
    let gpus = [gpu(3, 0, 0), gpu(1, 0, 0), gpu(3, 1, 0)];
    let nodes: Vec<u32> = slots(&gpus).iter().map(|s| s.node).collect();
    assert_eq!(nodes, [0, 1, 0]);
}

/// A view: up to 5 nodes of up to 4 GPUs, some memory held by work of random priorities.
fn view() -> impl Strategy<Value = View> {
    let gpus = proptest::collection::vec((0usize..5, 0u64..=4), 1..16);
    let work = proptest::collection::vec(
        (
            0i64..8,
            proptest::bool::ANY,
            0usize..16,
            1u64..=4,
            0usize..3,
        ),
        0..10,
    );
    (gpus, work).prop_map(|(gpus, work)| {
        let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
        let mut view = View::default();
        for (node, free_quarters) in gpus {
            let i = seen.entry(node).or_default();
            let mut g = gpu(node, *i, VRAM);
            *i += 1;
            g.free_mb = free_quarters * VRAM / 4;
            view.gpus.push(g);
        }
        for (n, (bid, spot, at, quarters, width)) in work.into_iter().enumerate() {
            // Work holds up to `width + 1` GPUs of the node of GPU `at`, in what is not free.
            let first = &view.gpus[at % view.gpus.len()];
            let node = first.node_id.clone();
            let mut holds = Vec::new();
            for g in view.gpus.iter_mut().filter(|g| g.node_id == node) {
                let used = g.vram_mb - g.free_mb;
                let held: u64 = view
                    .work
                    .iter()
                    .flat_map(|w: &Work| &w.holds)
                    .filter(|(u, _)| *u == g.uuid)
                    .map(|(_, mb)| mb)
                    .sum();
                let mb = (quarters * VRAM / 4).min(used.saturating_sub(held));
                if mb > 0 && holds.len() <= width {
                    holds.push((g.uuid.clone(), mb));
                }
            }
            if holds.is_empty() {
                continue;
            }
            view.work.push(Work {
                id: format!("w{n}"),
                priority: if spot { bid } else { ON_DEMAND },
                value: bid,
                started_at: i64::try_from(n).unwrap_or(0),
                ends_at: 3600,
                holds,
            });
        }
        view
    })
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (1u32..4).prop_map(|count| Request::Whole { count }),
        (1u64..=VRAM).prop_map(|vram_mb| Request::Share { vram_mb }),
    ]
}

proptest! {
    /// A plan takes only memory that is free once its victims are gone, never splits a gang
    /// across nodes, preempts only spot work of lower priority, and is the same plan each time.
    #[test]
    fn plans_take_only_what_is_free_and_never_split(
        view in view(),
        request in request(),
        priority in prop_oneof![0i64..9, Just(ON_DEMAND), Just(RESERVED)],
        expected in proptest::collection::vec(request(), 0..4),
    ) {
        let ask = Ask { request, priority };
        let result = plan(&view, &ask, &expected);
        prop_assert_eq!(&result, &plan(&view, &ask, &expected), "not deterministic");
        let Ok(p) = result else { return Ok(()) };
        let mut free: BTreeMap<&str, (u64, u64)> =
            view.gpus.iter().map(|g| (g.uuid.as_str(), (g.free_mb, g.vram_mb))).collect();
        for id in &p.victims {
            let w = view.work.iter().find(|w| &w.id == id);
            prop_assert!(w.is_some(), "a victim that is not in the view");
            let w = w.unwrap();
            prop_assert!(is_spot(w.priority) && w.priority < priority, "victim {} of priority {}", id, w.priority);
            for (uuid, mb) in &w.holds {
                if let Some(f) = free.get_mut(uuid.as_str()) {
                    f.0 = (f.0 + mb).min(f.1);
                }
            }
        }
        let mut taken = BTreeSet::new();
        for (uuid, mb) in &p.gpus {
            prop_assert!(taken.insert(uuid), "GPU {} taken twice", uuid);
            let g = view.gpus.iter().find(|g| &g.uuid == uuid).unwrap();
            prop_assert_eq!(&g.node_id, &p.node_id, "a gang split across nodes");
            let (f, vram) = free[uuid.as_str()];
            prop_assert!(*mb <= f, "took {} MiB of {} free on {}", mb, f, uuid);
            if p.whole {
                prop_assert!(f == vram && *mb == vram);
            }
        }
        match request {
            Request::Whole { count } => prop_assert_eq!(p.gpus.len(), count as usize),
            Request::Share { vram_mb } => {
                prop_assert_eq!(p.gpus.len(), 1);
                prop_assert_eq!(p.gpus[0].1, vram_mb);
            }
        }
        // Preempting happens only when free memory alone does not hold the request.
        if !p.victims.is_empty() {
            prop_assert!(crate::place(&slots(&view.gpus), &request).is_err());
        }
    }

    /// Preferring nodes (an image-locality bonus) changes only ties: a request fits exactly
    /// when it fits without the preference, preempts only when it would have, and a gang of
    /// whole GPUs goes to a node as tight as the one it would have had.
    #[test]
    fn a_preferred_node_wins_ties_only(
        view in view(),
        request in request(),
        priority in prop_oneof![0i64..9, Just(ON_DEMAND)],
        preferred in proptest::collection::btree_set(0usize..5, 0..3),
    ) {
        let ask = Ask { request, priority };
        let plain = plan(&view, &ask, &[]);
        let mut preferring = view.clone();
        let preferred: BTreeSet<String> = preferred.iter().map(|n| format!("n{n}")).collect();
        preferring.prefer_nodes(&preferred);
        let chosen = plan(&preferring, &ask, &[]);
        prop_assert_eq!(plain.is_ok(), chosen.is_ok());
        let (Ok(a), Ok(b)) = (plain, chosen) else { return Ok(()) };
        prop_assert_eq!(a.victims.is_empty(), b.victims.is_empty());
        let free_whole = |node: &str| {
            view.gpus.iter().filter(|g| g.node_id == node && g.free_mb >= g.vram_mb).count()
        };
        if a.victims.is_empty() && matches!(request, Request::Whole { .. }) {
            prop_assert_eq!(free_whole(&a.node_id), free_whole(&b.node_id));
        }
    }
}
