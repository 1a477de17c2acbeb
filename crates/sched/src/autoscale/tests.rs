use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use ReplicaState::{Ready, Starting, Unhealthy};

/// The endpoint's current generation in these tests.
const GEN: u64 = 2;

fn bounds(min: u32, max: u32, target_inflight: u32, scale_down_after_s: u64) -> Bounds {
    Bounds {
        min,
        max,
        target_inflight,
        scale_down_after_s,
    }
}

fn rep(index: u64, generation: u64, state: ReplicaState, inflight: u32) -> Replica {
    Replica {
        index,
        generation,
        state,
        inflight,
    }
}

fn load(inflight: u32, queued: u32) -> Load {
    Load { inflight, queued }
}

/// An input of the current generation, with no timer running and starts allowed.
fn at(now_s: i64, bounds: Bounds, load: Load, replicas: &[Replica]) -> Input<'_> {
    Input {
        now_s,
        bounds,
        load,
        replicas,
        generation: GEN,
        below_since: None,
        may_start: 100,
    }
}

fn ready(replicas: &[Replica]) -> usize {
    replicas.iter().filter(|r| r.state == Ready).count()
}

/// An endpoint driven by `decide`, applying each decision as the control plane would.
#[derive(Debug)]
struct Endpoint {
    replicas: Vec<Replica>,
    generation: u64,
    below_since: Option<i64>,
    next_index: u64,
}

impl Endpoint {
    fn new(generation: u64) -> Self {
        Endpoint {
            replicas: Vec::new(),
            generation,
            below_since: None,
            next_index: 0,
        }
    }

    /// One decision, applied: the stops removed, the starts added as `Starting`.
    fn step(&mut self, now_s: i64, bounds: Bounds, load: Load, may_start: u32) -> Decision {
        let d = decide(&Input {
            now_s,
            bounds,
            load,
            replicas: &self.replicas,
            generation: self.generation,
            below_since: self.below_since,
            may_start,
        });
        self.replicas.retain(|r| !d.stop.contains(&r.index));
        for _ in 0..d.start {
            self.replicas
                .push(rep(self.next_index, self.generation, Starting, 0));
            self.next_index += 1;
        }
        self.below_since = d.below_since;
        d
    }

    /// The replicas that were starting have booted.
    fn boot(&mut self) {
        for r in &mut self.replicas {
            if r.state == Starting {
                r.state = Ready;
            }
        }
    }
}

#[test]
fn zero_to_one_on_one_queued_request() {
    let d = decide(&at(0, bounds(0, 5, 4, 60), load(0, 1), &[]));
    assert_eq!(d.want, 1);
    assert_eq!(d.start, 1);
    assert!(d.stop.is_empty());
    assert_eq!(d.below_since, None);
}

#[test]
fn one_to_n_under_inflight_load() {
    let replicas = [rep(0, GEN, Ready, 13)];
    let d = decide(&at(0, bounds(1, 10, 4, 60), load(13, 0), &replicas));
    assert_eq!(d.want, 4);
    assert_eq!(d.start, 3);
    assert!(d.stop.is_empty());
}

#[test]
fn starting_replicas_count_as_coming_capacity() {
    let replicas = [rep(0, GEN, Ready, 4), rep(1, GEN, Starting, 0)];
    let d = decide(&at(0, bounds(1, 10, 4, 60), load(13, 0), &replicas));
    assert_eq!((d.want, d.start), (4, 2));
}

#[test]
fn no_scale_in_before_scale_down_after_s_and_scale_in_after() {
    let replicas: Vec<Replica> = (0..4).map(|i| rep(i, GEN, Ready, 0)).collect();
    let b = bounds(1, 10, 4, 60);
    let first = decide(&at(100, b, load(2, 0), &replicas));
    assert_eq!(first.want, 1);
    assert!(first.stop.is_empty());
    assert_eq!(first.below_since, Some(100));

    let early = decide(&Input {
        below_since: Some(100),
        ..at(159, b, load(2, 0), &replicas)
    });
    assert!(early.stop.is_empty());
    assert_eq!(early.below_since, Some(100));

    let due = decide(&Input {
        below_since: Some(100),
        ..at(160, b, load(2, 0), &replicas)
    });
    assert_eq!(due.stop, vec![3, 2, 1]);
    assert_eq!(due.start, 0);
    assert_eq!(due.below_since, None);
}

#[test]
fn timer_resets_when_the_load_comes_back() {
    let replicas: Vec<Replica> = (0..2).map(|i| rep(i, GEN, Ready, 4)).collect();
    let d = decide(&Input {
        below_since: Some(0),
        ..at(30, bounds(0, 10, 4, 60), load(8, 0), &replicas)
    });
    assert_eq!(d.want, 2);
    assert_eq!(d.below_since, None);
    assert!(d.stop.is_empty());
}

#[test]
fn scale_in_stops_starting_then_fewest_inflight_then_highest_index() {
    let replicas = [
        rep(0, GEN, Ready, 0),
        rep(1, GEN, Ready, 3),
        rep(2, GEN, Starting, 0),
        rep(3, GEN, Ready, 0),
        rep(4, GEN, Ready, 1),
    ];
    let d = decide(&at(0, bounds(1, 10, 4, 0), load(4, 0), &replicas));
    assert_eq!(d.want, 1);
    assert_eq!(d.stop, vec![2, 3, 0, 4]);
}

#[test]
fn n_to_zero_after_idle_with_min_zero() {
    let b = bounds(0, 10, 4, 300);
    let mut e = Endpoint::new(GEN);
    e.step(0, b, load(12, 0), 100);
    e.boot();
    assert_eq!(e.replicas.len(), 3);
    for now in (10..310).step_by(10) {
        let d = e.step(now, b, load(0, 0), 100);
        assert_eq!(d.want, 0);
        assert!(d.stop.is_empty(), "stopped at {now}");
        assert_eq!(e.replicas.len(), 3);
    }
    let d = e.step(310, b, load(0, 0), 100);
    assert_eq!(d.stop.len(), 3);
    assert!(e.replicas.is_empty());
    assert_eq!(e.below_since, None);
    // And back from zero on the next request.
    let d = e.step(320, b, load(0, 1), 100);
    assert_eq!(d.start, 1);
}

#[test]
fn min_kept() {
    let b = bounds(2, 10, 4, 0);
    let d = decide(&at(0, b, load(0, 0), &[]));
    assert_eq!((d.want, d.start), (2, 2));
    let replicas: Vec<Replica> = (0..5).map(|i| rep(i, GEN, Ready, 0)).collect();
    let d = decide(&at(0, b, load(0, 0), &replicas));
    assert_eq!(d.want, 2);
    assert_eq!(d.stop.len(), 3);
}

#[test]
fn max_respected() {
    let b = bounds(0, 3, 1, 60);
    let d = decide(&at(0, b, load(100, 50), &[]));
    assert_eq!((d.want, d.start), (3, 3));
    let replicas = [rep(0, GEN, Ready, 1), rep(1, GEN, Starting, 0)];
    let d = decide(&at(0, b, load(100, 50), &replicas));
    assert_eq!(d.start, 1);
    // Old replicas do not count towards the current generation's max.
    let replicas = [rep(0, GEN - 1, Ready, 1), rep(1, GEN - 1, Ready, 0)];
    let d = decide(&at(0, b, load(100, 50), &replicas));
    assert_eq!(d.start, 3);
    // A max of zero: nothing, even with requests waiting.
    let d = decide(&at(0, bounds(0, 0, 1, 60), load(0, 5), &[]));
    assert_eq!((d.want, d.start), (0, 0));
}

#[test]
fn may_start_caps_starts() {
    let b = bounds(0, 10, 1, 60);
    let d = decide(&Input {
        may_start: 2,
        ..at(0, b, load(5, 0), &[])
    });
    assert_eq!((d.want, d.start), (5, 2));
    let d = decide(&Input {
        may_start: 0,
        ..at(0, b, load(5, 0), &[])
    });
    assert_eq!((d.want, d.start), (5, 0));
}

#[test]
fn unhealthy_stopped_and_replaced() {
    let replicas = [
        rep(0, GEN, Ready, 4),
        rep(1, GEN, Unhealthy, 0),
        rep(2, GEN, Ready, 4),
    ];
    let d = decide(&at(0, bounds(1, 10, 4, 60), load(12, 0), &replicas));
    assert_eq!(d.want, 3);
    assert_eq!(d.stop, vec![1]);
    assert_eq!(d.start, 1);
    // Stopped even when it is not replaced (no start allowed, or no load).
    let d = decide(&Input {
        may_start: 0,
        ..at(0, bounds(0, 10, 4, 60), load(0, 0), &replicas)
    });
    assert!(d.stop.contains(&1));
    assert_eq!(d.start, 0);
}

#[test]
fn old_starting_and_unhealthy_stopped_at_once_old_ready_kept() {
    let replicas = [
        rep(0, GEN - 1, Ready, 2),
        rep(1, GEN - 1, Starting, 0),
        rep(2, GEN - 1, Unhealthy, 0),
        rep(3, GEN - 1, Ready, 1),
    ];
    let d = decide(&at(0, bounds(1, 10, 4, 60), load(8, 0), &replicas));
    assert_eq!(d.want, 2);
    assert_eq!(d.stop, vec![1, 2]);
    assert_eq!(d.start, 2);
}

#[test]
fn old_ready_go_fewest_inflight_then_lowest_index_once_new_ones_are_ready() {
    let replicas = [
        rep(5, GEN - 1, Ready, 2),
        rep(3, GEN - 1, Ready, 0),
        rep(4, GEN - 1, Ready, 0),
        rep(6, GEN, Ready, 0),
        rep(7, GEN, Ready, 0),
    ];
    let d = decide(&at(0, bounds(1, 10, 4, 60), load(8, 0), &replicas));
    assert_eq!(d.want, 2);
    assert_eq!(d.stop, vec![3, 4, 5]);
    assert_eq!(d.start, 0);
}

#[test]
fn old_ready_stopped_at_once_when_want_is_zero() {
    let replicas = [rep(0, GEN - 1, Ready, 0), rep(1, GEN - 1, Ready, 0)];
    let d = decide(&at(0, bounds(0, 10, 4, 600), load(0, 0), &replicas));
    assert_eq!(d.want, 0);
    assert_eq!(d.stop, vec![0, 1]);
    assert_eq!(d.start, 0);
}

/// Drives a rollout from generation 1 to 2 and checks the Ready count after every step.
fn roll_out(b: Bounds, l: Load, may_start: u32) {
    let mut e = Endpoint::new(1);
    e.step(0, b, l, 100);
    e.boot();
    let want = usize::try_from(want(&b, &l)).unwrap();
    assert_eq!(ready(&e.replicas), want);
    e.generation = GEN;
    for step in 1..100 {
        let d = e.step(step, b, l, may_start);
        assert_eq!(usize::try_from(d.want).unwrap(), want);
        assert!(
            ready(&e.replicas) >= want,
            "step {step}: {} Ready < {want}: {:?}",
            ready(&e.replicas),
            e.replicas
        );
        if e.replicas
            .iter()
            .all(|r| r.generation == GEN && r.state == Ready)
        {
            assert_eq!(e.replicas.len(), want);
            return;
        }
        e.boot();
    }
    panic!("the rollout did not finish: {:?}", e.replicas);
}

#[test]
fn rolling_update_keeps_ready_at_least_want() {
    let b = bounds(1, 10, 4, 60);
    roll_out(b, load(20, 0), 100);
    roll_out(b, load(20, 0), 1);
    roll_out(b, load(20, 3), 2);
    roll_out(bounds(3, 3, 4, 0), load(0, 0), 1);
}

#[test]
fn want_rounds_up_and_clamps() {
    assert_eq!(want(&bounds(0, 10, 4, 0), &load(13, 0)), 4);
    assert_eq!(want(&bounds(0, 10, 4, 0), &load(12, 0)), 3);
    assert_eq!(want(&bounds(0, 10, 0, 0), &load(3, 0)), 3);
    assert_eq!(want(&bounds(2, 10, 4, 0), &load(0, 0)), 2);
    assert_eq!(want(&bounds(0, 10, 100, 0), &load(0, 1)), 1);
    assert_eq!(want(&bounds(0, 5, 1, 0), &load(u32::MAX, u32::MAX)), 5);
}

/// Inputs owned, for proptest.
#[derive(Debug, Clone)]
struct Case {
    now_s: i64,
    bounds: Bounds,
    load: Load,
    replicas: Vec<Replica>,
    below_since: Option<i64>,
    may_start: u32,
}

impl Case {
    fn input(&self) -> Input<'_> {
        Input {
            now_s: self.now_s,
            bounds: self.bounds,
            load: self.load,
            replicas: &self.replicas,
            generation: GEN,
            below_since: self.below_since,
            may_start: self.may_start,
        }
    }
}

fn arb_state() -> impl Strategy<Value = ReplicaState> {
    prop_oneof![1 => Just(Starting), 4 => Just(Ready), 1 => Just(Unhealthy)]
}

fn arb_bounds() -> impl Strategy<Value = Bounds> {
    (0u32..4, 0u32..8, 0u32..6, 0u64..40)
        .prop_map(|(min, extra, target, after)| bounds(min, min + extra, target, after))
}

fn arb_case() -> impl Strategy<Value = Case> {
    let replicas = proptest::collection::vec(
        (prop::bool::weighted(0.7), arb_state(), 0u32..8, 0u64..3),
        0..14,
    )
    .prop_map(|rs| {
        let mut index = 0;
        rs.into_iter()
            .map(|(current, state, inflight, gap)| {
                index += 1 + gap;
                rep(index, if current { GEN } else { GEN - 1 }, state, inflight)
            })
            .collect::<Vec<_>>()
    })
    .prop_shuffle();
    (
        0i64..100,
        arb_bounds(),
        (0u32..40, prop::sample::select(vec![0u32, 0, 1, 5])),
        replicas,
        proptest::option::of(0i64..100),
        0u32..5,
    )
        .prop_map(
            |(now_s, bounds, (inflight, queued), replicas, below_since, may_start)| Case {
                now_s,
                bounds,
                load: load(inflight, queued),
                replicas,
                below_since,
                may_start,
            },
        )
}

/// The current generation's live replicas once a decision is applied (Unhealthy ones are
/// always stopped, so those left are serving or coming).
fn current_live_after(replicas: &[Replica], d: &Decision) -> u32 {
    let kept = replicas
        .iter()
        .filter(|r| r.generation == GEN && !d.stop.contains(&r.index))
        .count();
    u32::try_from(kept).unwrap() + d.start
}

proptest! {
    #[test]
    fn decisions_keep_the_invariants(case in arb_case()) {
        let input = case.input();
        let d = decide(&input);
        let b = case.bounds;

        // Stops are among the replicas, each once.
        let indexes: BTreeSet<u64> = case.replicas.iter().map(|r| r.index).collect();
        let stops: BTreeSet<u64> = d.stop.iter().copied().collect();
        prop_assert_eq!(stops.len(), d.stop.len(), "a stop twice: {:?}", d.stop);
        prop_assert!(stops.is_subset(&indexes));

        // Want within the bounds, at least one while requests wait.
        prop_assert!(d.want >= b.min && d.want <= b.max);
        if case.load.queued > 0 && b.max >= 1 {
            prop_assert!(d.want >= 1);
        }
        prop_assert_eq!(d.want, want(&b, &case.load));

        // Starts: within may_start, never past max, only when short of want.
        prop_assert!(d.start <= case.may_start);
        let live_before = u32::try_from(
            case.replicas.iter().filter(|r| r.generation == GEN && r.state != Unhealthy).count(),
        ).unwrap();
        if live_before <= b.max {
            prop_assert!(current_live_after(&case.replicas, &d) <= b.max);
        }
        if d.start > 0 {
            prop_assert!(current_live_after(&case.replicas, &d) <= d.want);
        }

        // Unhealthy replicas are always stopped.
        for r in case.replicas.iter().filter(|r| r.state == Unhealthy) {
            prop_assert!(stops.contains(&r.index));
        }

        // No current Ready replica stopped for scale-in before the delay has passed.
        let waited = match case.below_since {
            Some(since) => case.now_s - since >= i64::try_from(b.scale_down_after_s).unwrap(),
            None => b.scale_down_after_s == 0,
        };
        for r in case.replicas.iter().filter(|r| stops.contains(&r.index)) {
            if r.generation == GEN && r.state == Ready {
                prop_assert!(waited, "Ready {} stopped early", r.index);
            }
        }

        // The Ready count never drops below what the load asks for (or what there was).
        let ready_before = ready(&case.replicas);
        let ready_after = case
            .replicas
            .iter()
            .filter(|r| r.state == Ready && !stops.contains(&r.index))
            .count();
        let want_n = usize::try_from(d.want).unwrap();
        prop_assert!(ready_after >= want_n.min(ready_before), "{ready_after} < min({want_n}, {ready_before})");

        // The timer runs exactly while capacity exceeds want and the excess is not yet stopped.
        let capacity = case
            .replicas
            .iter()
            .filter(|r| r.generation == GEN && r.state != Unhealthy)
            .count();
        if capacity <= want_n || waited {
            prop_assert_eq!(d.below_since, None);
        } else {
            prop_assert_eq!(d.below_since, Some(case.below_since.unwrap_or(case.now_s)));
        }

        // Deterministic.
        prop_assert_eq!(decide(&input), d);
    }

    /// Over a run of decisions with changing load, booting, failing replicas and new
    /// generations, capacity is only taken away once it has exceeded want for the delay, and
    /// the Ready count never falls below min(want, Ready before).
    #[test]
    fn runs_keep_the_invariants(
        b in arb_bounds(),
        steps in proptest::collection::vec(
            (1i64..20, 0u32..40, 0u32..3, 0u32..4, prop::bool::weighted(0.6), prop::bool::weighted(0.05), prop::bool::weighted(0.1)),
            1..60,
        ),
    ) {
        let mut e = Endpoint::new(GEN);
        let mut now = 0;
        let mut over_since: Option<i64> = None;
        for (dt, inflight, queued, may_start, boot, fail, bump) in steps {
            now += dt;
            if bump {
                e.generation += 1;
            }
            let l = load(inflight, queued);
            let w = usize::try_from(want(&b, &l)).unwrap();
            let capacity = e
                .replicas
                .iter()
                .filter(|r| r.generation == e.generation && r.state != Unhealthy)
                .count();
            over_since = if capacity > w { Some(over_since.unwrap_or(now)) } else { None };
            let before = e.replicas.clone();
            let d = e.step(now, b, l, may_start);
            prop_assert_eq!(usize::try_from(d.want).unwrap(), w);
            for r in before.iter().filter(|r| d.stop.contains(&r.index)) {
                if r.generation == e.generation && r.state != Unhealthy {
                    let since = over_since.unwrap();
                    prop_assert!(now - since >= i64::try_from(b.scale_down_after_s).unwrap());
                }
            }
            prop_assert!(ready(&e.replicas) >= w.min(ready(&before)));
            let live = e.replicas.iter().filter(|r| r.generation == e.generation).count();
            prop_assert!(live <= usize::try_from(b.max).unwrap());
            if d.stop.iter().any(|i| before.iter().any(|r| r.index == *i && r.generation == e.generation && r.state != Unhealthy)) {
                over_since = None;
            }
            if boot {
                e.boot();
            }
            if fail {
                if let Some(r) = e.replicas.first_mut() {
                    r.state = Unhealthy;
                }
            }
        }
    }
}
