//! Endpoint autoscaling: from an endpoint's load and live replicas, how many replicas to start and
//! which to stop, one call at a time (pure: the time and the scale-in timer are arguments).

use std::cmp::Reverse;
use std::collections::BTreeSet;

/// An endpoint's scaling settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Fewest replicas kept whatever the load (0 allows scaling to zero).
    pub min: u32,
    /// Most live replicas of the current generation at once; it wins over `min` if below it.
    pub max: u32,
    /// Requests (in flight or queued) one replica is meant to carry; 0 is read as 1.
    pub target_inflight: u32,
    /// How long, in seconds, capacity must have exceeded `want` before the excess is stopped.
    pub scale_down_after_s: u64,
}

/// Where one replica is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaState {
    /// Placed and booting: counts as capacity that is coming, but serves nothing yet.
    Starting,
    /// Serving requests.
    Ready,
    /// Failing its health checks: no capacity, stopped at once (and replaced if needed).
    Unhealthy,
}

/// One live replica of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    /// The replica's number within the endpoint, unique among its replicas.
    pub index: u64,
    /// The endpoint generation (spec version) it runs.
    pub generation: u64,
    pub state: ReplicaState,
    /// Requests it is serving now.
    pub inflight: u32,
}

/// What the endpoint carries now, summed over the control planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Requests being served.
    pub inflight: u32,
    /// Requests waiting for a replica.
    pub queued: u32,
}

/// Everything one decision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input<'a> {
    /// The time of the decision, in seconds.
    pub now_s: i64,
    pub bounds: Bounds,
    pub load: Load,
    /// The live replicas only (ended ones are not passed).
    pub replicas: &'a [Replica],
    /// The endpoint's current generation (spec version): replicas of another one are old.
    pub generation: u64,
    /// Carried from the previous [`Decision`] (`None` the first time).
    pub below_since: Option<i64>,
    /// At most this many new replicas now (tenant limits, credit, failure back-off); 0: none.
    pub may_start: u32,
}

/// What the control plane should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// New replicas of the current generation to start.
    pub start: u32,
    /// Indexes of replicas to stop, each once, all of them among the input's replicas.
    pub stop: Vec<u64>,
    /// How many replicas the load asks for, within the bounds.
    pub want: u32,
    /// Since when the current generation's capacity has exceeded `want` (`None`: it does not);
    /// to pass back as [`Input::below_since`] next time.
    pub below_since: Option<i64>,
}

/// How many replicas `load` asks for: the requests (in flight and queued) over the target per
/// replica, rounded up, within `[min, max]`; at least one while requests wait (if `max` allows).
pub fn want(bounds: &Bounds, load: &Load) -> u32 {
    let target = u64::from(bounds.target_inflight.max(1));
    let requests = u64::from(load.inflight) + u64::from(load.queued);
    let mut want = requests.div_ceil(target).max(u64::from(bounds.min));
    if load.queued > 0 {
        want = want.max(1);
    }
    let want = want.min(u64::from(bounds.max));
    u32::try_from(want).unwrap_or(bounds.max)
}

/// Stops in the order decided, never the same index twice.
#[derive(Debug, Default)]
struct Stops {
    order: Vec<u64>,
    seen: BTreeSet<u64>,
}

impl Stops {
    fn push(&mut self, index: u64) {
        if self.seen.insert(index) {
            self.order.push(index);
        }
    }

    fn has(&self, index: u64) -> bool {
        self.seen.contains(&index)
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Whether `delay_s` has passed from `since_s` to `now_s`.
fn elapsed(since_s: i64, now_s: i64, delay_s: u64) -> bool {
    i128::from(now_s) - i128::from(since_s) >= i128::from(delay_s)
}

/// One decision for one endpoint (see the module's rules):
///
/// - `Unhealthy` replicas, and old (`generation` other than the input's) `Starting` ones, are
///   stopped at once.
/// - Scale-out is immediate: when the current generation's `Starting` + `Ready` replicas are
///   fewer than `want`, the difference is started, up to `may_start` and without the current
///   generation's live replicas exceeding `max`. Old replicas are not counted.
/// - Scale-in waits: the excess of that capacity over `want` is stopped only once it has lasted
///   `scale_down_after_s` since `below_since` (`Starting` before `Ready`, then the fewest in
///   flight, then the highest index). The timer restarts after a scale-in.
/// - Old `Ready` replicas are stopped (fewest in flight, then lowest index) only while the
///   `Ready` replicas left, old and new, stay at least `want`: a rollout never leaves fewer
///   `Ready` replicas than the load asks for.
pub fn decide(input: &Input<'_>) -> Decision {
    let bounds = &input.bounds;
    let want = want(bounds, &input.load);
    let is_current = |r: &Replica| r.generation == input.generation;
    let mut stops = Stops::default();

    for r in input.replicas {
        let broken = r.state == ReplicaState::Unhealthy;
        let old_starting = !is_current(r) && r.state == ReplicaState::Starting;
        if broken || old_starting {
            stops.push(r.index);
        }
    }

    // The current generation's capacity: serving or coming.
    let mut capacity: Vec<&Replica> = input
        .replicas
        .iter()
        .filter(|r| is_current(r) && r.state != ReplicaState::Unhealthy && !stops.has(r.index))
        .collect();
    let have = count(capacity.len());

    let mut start = 0;
    let mut below_since = None;
    if have < want {
        let room = bounds.max.saturating_sub(have);
        start = (want - have).min(input.may_start).min(room);
    } else if have > want {
        let since = input.below_since.unwrap_or(input.now_s);
        if elapsed(since, input.now_s, bounds.scale_down_after_s) {
            capacity.sort_by_key(|r| {
                (
                    r.state != ReplicaState::Starting,
                    r.inflight,
                    Reverse(r.index),
                )
            });
            let excess = usize::try_from(have - want).unwrap_or(usize::MAX);
            for r in capacity.iter().take(excess) {
                stops.push(r.index);
            }
        } else {
            below_since = Some(since);
        }
    }

    // Rolling update: an old Ready replica goes only while enough Ready ones are left.
    let mut ready = count(
        input
            .replicas
            .iter()
            .filter(|r| r.state == ReplicaState::Ready && !stops.has(r.index))
            .count(),
    );
    let mut old_ready: Vec<&Replica> = input
        .replicas
        .iter()
        .filter(|r| !is_current(r) && r.state == ReplicaState::Ready && !stops.has(r.index))
        .collect();
    old_ready.sort_by_key(|r| (r.inflight, r.index));
    for r in old_ready {
        if ready <= want {
            break;
        }
        if !stops.has(r.index) {
            stops.push(r.index);
            ready -= 1;
        }
    }

    Decision {
        start,
        stop: stops.order,
        want,
        below_since,
    }
}

#[cfg(test)]
mod tests;
