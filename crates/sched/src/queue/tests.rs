use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

mod fair;
mod quota;

fn gpu(node: u32, vram_mb: u64, free_mb: u64) -> GpuSlot {
    GpuSlot {
        node,
        vram_mb,
        free_mb,
        switch: None,
    }
}

fn item(id: u64, request: Request, priority: i64, enqueued_at: i64, dur: Option<u64>) -> Pending {
    Pending {
        id,
        request,
        priority,
        enqueued_at,
        duration_s: dur,
        account: 0,
        guaranteed: false,
    }
}

fn running(
    id: u64,
    priority: i64,
    value: i64,
    ends_at: Option<i64>,
    holds: Vec<(usize, u64)>,
) -> Running {
    Running {
        id,
        priority,
        value,
        started_at: 0,
        ends_at,
        holds,
        borrowed_of: None,
    }
}

fn queue(config: QueueConfig, items: Vec<Pending>) -> Queue {
    let mut q = Queue::new(config);
    for i in items {
        q.push(i).unwrap();
    }
    q
}

const ONE: Request = Request::Whole { count: 1 };

#[test]
fn higher_priority_first_two_items_never_share_memory_and_backfill_behind() {
    // a (spot, 5) and c (spot, 9) have aged, but on-demand b still comes first; a no longer
    // fits what b left and becomes the head; c fits beside the room a waits for.
    let gpus = [gpu(0, 1000, 1000)];
    let mut q = queue(
        QueueConfig::default(),
        vec![
            item(1, Request::Share { vram_mb: 600 }, 5, 0, Some(60)),
            item(2, Request::Share { vram_mb: 600 }, ON_DEMAND, 10, Some(100)),
            item(3, Request::Share { vram_mb: 300 }, 9, 5, None),
        ],
    );
    let out = q.pass(10, &gpus, &[]);
    let placed: Vec<_> = out
        .placed
        .iter()
        .map(|p| (p.item.id, p.placement.gpus.clone(), p.backfilled))
        .collect();
    assert_eq!(
        placed,
        vec![(2, vec![(0, 600)], false), (3, vec![(0, 300)], true)]
    );
    assert_eq!(out.waiting, vec![(1, Reason::BehindHigherPriority)]);
    assert_eq!(
        out.head,
        Some(Head {
            id: 1,
            start_at: 110,
            gpus: vec![(0, 600)]
        })
    );
    assert!(out.preempted.is_empty());
    assert_eq!(q.iter().map(|p| p.id).collect::<Vec<_>>(), vec![1]);
    assert_eq!(
        out.reason(1).map(ToString::to_string).as_deref(),
        Some("waiting behind higher priority")
    );
}

#[test]
fn backfill_only_what_ends_before_the_head_starts() {
    // Node 0: GPU 0 busy until 100 (on-demand, not preemptible), GPU 1 free. Node 1: GPU 2
    // busy for good. The head wants both GPUs of node 0 from 100.
    let gpus = [gpu(0, 1000, 0), gpu(0, 1000, 1000), gpu(1, 1000, 0)];
    let run = [
        running(10, ON_DEMAND, 9, Some(100), vec![(0, 1000)]),
        running(11, ON_DEMAND, 9, None, vec![(2, 1000)]),
    ];
    let mut q = queue(
        QueueConfig::default(),
        vec![
            item(1, Request::Whole { count: 2 }, ON_DEMAND, 0, Some(50)),
            item(2, ONE, ON_DEMAND, 1, Some(200)),
            item(3, ONE, ON_DEMAND, 2, Some(90)),
        ],
    );
    let out = q.pass(10, &gpus, &run);
    assert_eq!(out.placed.len(), 1);
    assert_eq!(out.placed[0].item.id, 3);
    assert_eq!(out.placed[0].placement.gpus, vec![(1, 1000)]);
    assert!(out.placed[0].backfilled);
    assert_eq!(
        out.waiting,
        vec![
            (
                1,
                Reason::NoFit(NoFit::NotEnoughOnOneNode {
                    wanted: 2,
                    most_on_one_node: 1
                })
            ),
            (
                2,
                Reason::ReservedForHead {
                    head: 1,
                    until: 100
                }
            ),
        ]
    );
    assert_eq!(
        out.head,
        Some(Head {
            id: 1,
            start_at: 100,
            gpus: vec![(0, 1000), (1, 1000)]
        })
    );
    assert_eq!(
        out.reason(2).map(ToString::to_string).as_deref(),
        Some("reserved for the head (reservation 1) until 100")
    );
    assert!(out.preempted.is_empty(), "on-demand work is never a victim");

    // Once node 1 frees up, the long item goes there: it does not touch the head's room.
    let gpus = [gpu(0, 1000, 0), gpu(0, 1000, 0), gpu(1, 1000, 1000)];
    let run = [
        running(10, ON_DEMAND, 9, Some(100), vec![(0, 1000)]),
        running(3, ON_DEMAND, 9, Some(100), vec![(1, 1000)]),
    ];
    let out = q.pass(20, &gpus, &run);
    assert_eq!(
        out.placement(2).map(|p| p.gpus.clone()),
        Some(vec![(2, 1000)])
    );
    assert_eq!(out.head.map(|h| h.start_at), Some(100));
}

#[test]
fn on_demand_preempts_the_cheapest_spot_and_spot_waits() {
    // Node 0: GPU 0 held by a spot bid of 3, GPU 1 by a spot bid of 7 (until 500). Node 1:
    // GPU 2 held by open-ended on-demand work.
    let gpus = [gpu(0, 1000, 0), gpu(0, 1000, 0), gpu(1, 1000, 0)];
    let run = [
        running(10, 3, 3, None, vec![(0, 1000)]),
        running(11, 7, 7, Some(500), vec![(1, 1000)]),
        running(12, ON_DEMAND, 50, None, vec![(2, 1000)]),
    ];
    let items = vec![
        item(1, ONE, ON_DEMAND, 0, Some(3600)),
        item(2, ONE, 100, 0, Some(60)),
    ];
    let mut q = queue(QueueConfig::default(), items.clone());
    let out = q.pass(0, &gpus, &run);
    assert_eq!(out.preempted, vec![10]);
    assert_eq!(out.placed.len(), 1);
    assert_eq!(out.placed[0].preempts, vec![10]);
    assert_eq!(out.placed[0].placement.gpus, vec![(0, 1000)]);
    assert_eq!(
        out.waiting,
        vec![(
            2,
            Reason::NoFit(NoFit::NotEnoughOnOneNode {
                wanted: 1,
                most_on_one_node: 0
            })
        )]
    );
    assert_eq!(
        out.head,
        Some(Head {
            id: 2,
            start_at: 500,
            gpus: vec![(1, 1000)]
        })
    );

    // Where spot may preempt lower bids, the bid of 100 takes the bid of 7's GPU.
    let config = QueueConfig {
        spot_preempts_lower_bids: true,
        ..QueueConfig::default()
    };
    let mut q = queue(config, items);
    let out = q.pass(0, &gpus, &run);
    assert_eq!(out.preempted, vec![10, 11]);
    assert_eq!(
        out.placement(2).map(|p| p.gpus.clone()),
        Some(vec![(1, 1000)])
    );
    assert!(q.is_empty());
}

#[test]
fn aging_lifts_old_spot_work_over_a_higher_newer_bid() {
    let config = QueueConfig::default();
    let old = item(1, ONE, 1, 0, None);
    let new = item(2, ONE, 5_001, 5, None);
    assert_eq!(config.effective_priority(&old, 5), 5_001);
    assert_eq!(config.effective_priority(&new, 5), 5_001);
    assert_eq!(
        config.effective_priority(&new, 0),
        5_001,
        "no credit for the future"
    );
    // A tie: the older goes first.
    let mut q = queue(config, vec![new.clone(), old.clone()]);
    let out = q.pass(5, &[gpu(0, 1000, 1000)], &[]);
    assert_eq!(out.placed[0].item.id, 1);
    assert_eq!(out.waiting, vec![(2, Reason::BehindHigherPriority)]);
    // A second earlier, the newer bid wins.
    let mut q = queue(config, vec![new, old]);
    let out = q.pass(4, &[gpu(0, 1000, 1000)], &[]);
    assert_eq!(out.placed[0].item.id, 2);
}

#[test]
fn the_allowed_filter_keeps_items_to_their_gpus() {
    // Best fit would pick GPU 0 (the fuller node); the item may only use GPU 2.
    let gpus = [gpu(0, 1000, 1000), gpu(0, 1000, 0), gpu(1, 1000, 1000)];
    let mut q = queue(
        QueueConfig::default(),
        vec![
            item(1, ONE, ON_DEMAND, 0, None),
            item(2, Request::Whole { count: 2 }, ON_DEMAND, 0, None),
        ],
    );
    let out = q.pass_with(0, &gpus, &[], |p, g| p.id != 1 || g == 2);
    assert_eq!(
        out.placement(1).map(|p| p.gpus.clone()),
        Some(vec![(2, 1000)])
    );
    assert_eq!(
        out.reason(2),
        Some(&Reason::NoFit(NoFit::NotEnoughOnOneNode {
            wanted: 2,
            most_on_one_node: 1
        }))
    );
    assert_eq!(out.head, None, "nothing running ever makes room for two");
}

#[test]
fn the_queue_refuses_duplicates_and_empty_requests() {
    let mut q = Queue::new(QueueConfig::default());
    q.push(item(1, ONE, 1, 0, None)).unwrap();
    assert_eq!(
        q.push(item(1, ONE, 2, 0, None)),
        Err(QueueError::Duplicate { id: 1 })
    );
    assert_eq!(
        q.push(item(2, Request::Share { vram_mb: 0 }, 2, 0, None)),
        Err(QueueError::Empty { id: 2 })
    );
    assert_eq!(q.len(), 1);
    assert_eq!(q.remove(1).map(|p| p.priority), Some(1));
    assert!(q.remove(1).is_none());
}

#[test]
fn earliest_start_counts_overdue_work_as_ending_now() {
    let gpus = [gpu(0, 1000, 0)];
    let run = [running(1, 1, 1, Some(5), vec![(0, 1000)])];
    assert_eq!(
        earliest_start(10, &gpus, &run, &ONE).map(|(t, p)| (t, p.gpus)),
        Some((10, vec![(0, 1000)]))
    );
    let run = [running(1, 1, 1, None, vec![(0, 1000)])];
    assert_eq!(earliest_start(10, &gpus, &run, &ONE), None);
}

// ---- properties ----

const NOW: i64 = 100;

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (1u32..4).prop_map(|count| Request::Whole { count }),
        (1u64..4000).prop_map(|vram_mb| Request::Share { vram_mb }),
    ]
}

fn base_priority() -> impl Strategy<Value = i64> {
    prop_oneof![3 => 1i64..20, 1 => Just(ON_DEMAND), 1 => Just(RESERVED)]
}

/// A cluster with running work on it: the work is placed in turn on the empty cluster, and
/// what does not fit is dropped.
fn world() -> impl Strategy<Value = (Vec<GpuSlot>, Vec<Running>)> {
    let slots = proptest::collection::vec((0u32..4, 1u64..=4), 1..12);
    let work = proptest::collection::vec(
        (
            request(),
            base_priority(),
            0i64..100,
            proptest::option::weighted(0.8, 0i64..300),
            proptest::option::weighted(0.3, 0u64..3),
        ),
        0..14,
    );
    (slots, work).prop_map(|(slots, work)| {
        let mut gpus: Vec<GpuSlot> = slots
            .into_iter()
            .map(|(n, v)| gpu(n, v * 1000, v * 1000))
            .collect();
        let mut run = Vec::new();
        for (id, (req, priority, value, ends, borrowed_of)) in (100u64..).zip(work) {
            if let Ok(p) = place(&gpus, &req) {
                take(&mut gpus, &p.gpus);
                run.push(Running {
                    // A reserved block is never borrowed work.
                    borrowed_of: borrowed_of.filter(|_| priority != RESERVED),
                    ..running(id, priority, value, ends, p.gpus)
                });
            }
        }
        (gpus, run)
    })
}

fn pending() -> impl Strategy<Value = Vec<Pending>> {
    proptest::collection::vec(
        (
            request(),
            base_priority(),
            0i64..=NOW,
            proptest::option::weighted(0.8, 1u64..300),
            0u64..3,
            any::<bool>(),
        ),
        0..10,
    )
    .prop_map(|v| {
        (0u64..)
            .zip(v)
            .map(|(id, (r, p, enq, dur, account, guaranteed))| Pending {
                account,
                guaranteed,
                ..item(id, r, p, enq, dur)
            })
            .collect()
    })
}

fn config() -> impl Strategy<Value = QueueConfig> {
    (0u64..3, any::<bool>()).prop_map(|(aging, spot)| QueueConfig {
        aging_per_second: aging,
        preempt_from: ON_DEMAND,
        spot_preempts_lower_bids: spot,
    })
}

/// The invariants of every pass (see `a_pass_keeps_every_invariant`), whatever its order: `q`
/// and `out` are the queue and the outcome after a pass at `NOW` over `items`.
fn check_pass(
    gpus: &[GpuSlot],
    run: &[Running],
    items: &[Pending],
    config: QueueConfig,
    q: &Queue,
    out: &PassOutcome,
) -> Result<(), TestCaseError> {
    let by_id: BTreeMap<u64, &Running> = run.iter().map(|r| (r.id, r)).collect();

    // Preemption: spot of a strictly lower base priority by an item with leave, or another
    // account's borrowed work by a guaranteed item; each victim once.
    let mut stopped = BTreeSet::new();
    for p in &out.placed {
        for v in &p.preempts {
            prop_assert!(stopped.insert(*v), "a victim stopped twice");
            let victim = by_id[v];
            let spot = config.may_preempt_spot(&p.item)
                && victim.priority < p.item.priority
                && victim.priority < config.preempt_from;
            let reclaimed =
                p.item.guaranteed && victim.borrowed_of.is_some_and(|a| a != p.item.account);
            prop_assert!(spot || reclaimed, "{:?} preempted {:?}", p.item, victim);
            prop_assert!(victim.priority != RESERVED, "a reserved block preempted");
        }
    }
    let preempted: BTreeSet<u64> = out.preempted.iter().copied().collect();
    prop_assert_eq!(&preempted, &stopped);

    // Memory: what survives plus what was placed fits every GPU.
    let mut used = vec![0u64; gpus.len()];
    let mut after: Vec<Running> = Vec::new();
    for r in run.iter().filter(|r| !stopped.contains(&r.id)) {
        for &(g, mb) in &r.holds {
            used[g] += mb;
        }
        after.push(r.clone());
    }
    for p in &out.placed {
        let gs = &p.placement.gpus;
        match p.item.request {
            Request::Whole { count } => {
                prop_assert_eq!(gs.len(), count as usize);
                let nodes: BTreeSet<u32> = gs.iter().map(|&(g, _)| gpus[g].node).collect();
                prop_assert_eq!(nodes.len(), 1, "a gang split across nodes");
                let distinct: BTreeSet<usize> = gs.iter().map(|&(g, _)| g).collect();
                prop_assert_eq!(distinct.len(), gs.len());
                for &(g, mb) in gs {
                    prop_assert_eq!(mb, gpus[g].vram_mb);
                }
            }
            Request::Share { vram_mb } => {
                prop_assert_eq!(gs.len(), 1);
                prop_assert_eq!(gs[0].1, vram_mb);
            }
        }
        for &(g, mb) in gs {
            used[g] += mb;
        }
        after.push(Running {
            id: p.item.id,
            priority: p.item.priority,
            value: 0,
            started_at: NOW,
            ends_at: p.item.duration_s.map(|d| NOW + d as i64),
            holds: gs.clone(),
            borrowed_of: None,
        });
    }
    for (g, s) in gpus.iter().enumerate() {
        prop_assert!(
            used[g] <= s.vram_mb,
            "GPU {} holds {} of {}",
            g,
            used[g],
            s.vram_mb
        );
    }

    // Every item: placed or waiting with a reason, never both; the rest stay queued.
    let placed: BTreeSet<u64> = out.placed.iter().map(|p| p.item.id).collect();
    let waiting: BTreeSet<u64> = out.waiting.iter().map(|(id, _)| *id).collect();
    prop_assert_eq!(placed.len(), out.placed.len());
    prop_assert_eq!(waiting.len(), out.waiting.len());
    prop_assert!(placed.is_disjoint(&waiting));
    let all: BTreeSet<u64> = items.iter().map(|p| p.id).collect();
    prop_assert_eq!(&placed | &waiting, all);
    let queued: BTreeSet<u64> = q.iter().map(|p| p.id).collect();
    prop_assert_eq!(queued, waiting.clone());

    // Backfill never delays the head: on the cluster as the pass leaves it, the head can
    // still start by the time it was promised.
    if let Some(head) = &out.head {
        prop_assert!(waiting.contains(&head.id));
        let request = items[usize::try_from(head.id).unwrap()].request;
        let left: Vec<GpuSlot> = gpus
            .iter()
            .zip(&used)
            .map(|(s, &u)| gpu(s.node, s.vram_mb, s.vram_mb - u))
            .collect();
        let start = earliest_start(NOW, &left, &after, &request).map(|(t, _)| t);
        prop_assert!(
            start.is_some_and(|t| t <= head.start_at),
            "head {} promised {}, now {:?}",
            head.id,
            head.start_at,
            start
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// After a pass: no GPU holds more than its memory, gangs stay on one node, only strictly
    /// lower spot work is preempted, every item is placed or has a reason, and the head's
    /// start is no later than the pass said.
    #[test]
    fn a_pass_keeps_every_invariant(
        (gpus, run) in world(),
        items in pending(),
        config in config(),
    ) {
        let mut q = queue(config, items.clone());
        let out = q.pass(NOW, &gpus, &run);
        check_pass(&gpus, &run, &items, config, &q, &out)?;
    }

    /// Waiting long enough beats any fixed priority: the old item, once it has waited
    /// `(newcomer - base) / rate + 1` seconds, gets the one GPU ahead of a newcomer.
    #[test]
    fn aging_eventually_outranks_any_newcomer(
        rate in 1u64..5_000,
        base in -1_000_000_000_000i64..1_000_000_000_000,
        newcomer in -1_000_000_000_000i64..3 * ON_DEMAND,
        enqueued in 0i64..1_000,
    ) {
        let config = QueueConfig { aging_per_second: rate, ..QueueConfig::default() };
        let wait = (newcomer - base).max(0) / rate as i64 + 1;
        let now = enqueued + wait;
        let old = item(1, ONE, base, enqueued, None);
        let new = item(2, ONE, newcomer, now, None);
        prop_assert!(config.effective_priority(&old, now) > config.effective_priority(&new, now));
        let mut q = queue(config, vec![new, old]);
        let out = q.pass(now, &[gpu(0, 1000, 1000)], &[]);
        prop_assert_eq!(out.placed.len(), 1);
        prop_assert_eq!(out.placed[0].item.id, 1);
        prop_assert_eq!(out.reason(2), Some(&Reason::BehindHigherPriority));
    }
}
