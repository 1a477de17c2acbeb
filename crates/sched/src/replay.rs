//! The simulator's second mode: the trace's own creation and deletion times replayed through a
//! policy, with a FIFO queue and backfill for what does not fit, for the wait each pod sees.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use crate::cluster::{Assignment, Cluster, ClusterError, Pod};
use crate::experiment::{node_rank, POPULARITY};
use crate::policies::{self, schedule_with, Policy, TieBreak};
use crate::rng::SimRng;
use crate::trace::PodRow;
use crate::workload::Workload;

pub mod fair_share;

/// A pod with the times the trace gives it, in seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedPod {
    pub pod: Pod,
    pub creation: u64,
    /// Deletion − creation: how long it runs once started.
    pub duration: u64,
}

/// The pods of a pod list that can be replayed, and how many could not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedPods {
    pub pods: Vec<TimedPod>,
    /// Rows without a creation or a deletion time, or deleted before they were created.
    pub skipped: usize,
}

/// The rows' pods on this cluster, with their times; rows without both times are skipped.
pub fn timed_pods(cluster: &Cluster, rows: &[PodRow]) -> TimedPods {
    let mut pods = Vec::with_capacity(rows.len());
    let mut skipped = 0;
    for r in rows {
        match (r.creation_time, r.deletion_time) {
            (Some(c), Some(d)) if d >= c => pods.push(TimedPod {
                pod: cluster.pod(r),
                creation: c,
                duration: d - c,
            }),
            _ => skipped += 1,
        }
    }
    TimedPods { pods, skipped }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    #[error(
        "no pod of the list has both a creation and a deletion time: there is nothing to replay"
    )]
    NoTimes,
    #[error("no policy named `{0}`")]
    UnknownPolicy(String),
    #[error("the policy `{policy}` made an invalid placement")]
    InvalidPlacement {
        policy: &'static str,
        #[source]
        source: ClusterError,
    },
    #[error("a departure under the policy `{policy}` could not be released")]
    InvalidRelease {
        policy: &'static str,
        #[source]
        source: ClusterError,
    },
}

/// What became of every pod under one policy, by index into the replayed pods.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    pub policy: &'static str,
    /// When each pod started; `None` for a pod still waiting when everything else had left.
    pub starts: Vec<Option<u64>>,
    /// Where each pod ran.
    pub assignments: Vec<Option<Assignment>>,
    /// The first arrival and the last event.
    pub span: (u64, u64),
    /// Allocated milli-GPU integrated over time, in milli-GPU-seconds.
    pub gpu_milli_seconds: u128,
    /// Placement attempts handed to the policy: every arrival, and every queued pod retried on
    /// a node that had room for it.
    pub decisions: u64,
    /// Time spent placing, releasing and retrying the queue.
    pub busy: Duration,
}

/// One policy's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRun {
    pub policy: &'static str,
    pub placed: u64,
    /// Pods still waiting at the end: no node of the empty cluster fits them.
    pub never_placed: u64,
    /// Over the placed pods, start − creation (0 for a pod placed on arrival).
    pub mean_wait_s: f64,
    /// The 99th percentile (nearest rank) of the same waits.
    pub p99_wait_s: f64,
    /// Allocated over capacity, averaged over time from the first arrival to the last departure.
    pub mean_gpu_allocation_ratio: f64,
    pub decisions: u64,
    pub decisions_per_sec: f64,
}

const DEPART: u8 = 0;
/// Departures sort before arrivals at the same second, so the room they free is there first.
const ARRIVE: u8 = 1;

/// The state of one replay.
struct Replayer<'a> {
    pods: &'a [TimedPod],
    cluster: Cluster,
    policy: Box<dyn Policy>,
    policy_name: &'static str,
    rng: SimRng,
    rank: Vec<u32>,
    /// (time, kind, pod), earliest first.
    events: BinaryHeap<Reverse<(u64, u8, usize)>>,
    /// Waiting pods in arrival order.
    queue: Vec<usize>,
    starts: Vec<Option<u64>>,
    assignments: Vec<Option<Assignment>>,
    allocated_milli: u64,
    decisions: u64,
}

impl Replayer<'_> {
    /// Hands the pod to the policy; starts it and returns `true` if placed.
    fn try_place(&mut self, i: usize, now: u64) -> Result<bool, ReplayError> {
        let pods = self.pods;
        let timed = &pods[i];
        self.decisions += 1;
        let choice = schedule_with(
            &self.cluster,
            &timed.pod,
            self.policy.as_mut(),
            &mut self.rng,
            TieBreak::Ranked(&self.rank),
        );
        let Some(a) = choice else {
            return Ok(false);
        };
        self.cluster
            .allocate(&timed.pod, &a)
            .map_err(|source| ReplayError::InvalidPlacement {
                policy: self.policy_name,
                source,
            })?;
        self.policy.placed(&self.cluster, &a, &timed.pod);
        self.allocated_milli += timed.pod.gpu.total_milli();
        self.starts[i] = Some(now);
        self.assignments[i] = Some(a);
        self.events
            .push(Reverse((now.saturating_add(timed.duration), DEPART, i)));
        Ok(true)
    }

    fn depart(&mut self, i: usize, now: u64) -> Result<(), ReplayError> {
        let pods = self.pods;
        let pod = &pods[i].pod;
        let Some(a) = self.assignments[i].as_ref() else {
            return Ok(());
        };
        self.cluster
            .release(pod, a)
            .map_err(|source| ReplayError::InvalidRelease {
                policy: self.policy_name,
                source,
            })?;
        self.policy.released(&self.cluster, a, pod);
        self.allocated_milli -= pod.gpu.total_milli();
        let node = a.node;
        // A queued pod fits on no node: it was tried when it arrived and again whenever a node
        // gained room since. Only this node gained room now, so a queued pod it cannot host
        // still fits nowhere and is not handed to the policy; the placements are those of
        // retrying the whole queue on every node, at a fraction of the cost.
        let queue = std::mem::take(&mut self.queue);
        let mut waiting = Vec::with_capacity(queue.len());
        for q in queue {
            if !(self.cluster.nodes[node].fits(&pods[q].pod) && self.try_place(q, now)?) {
                waiting.push(q);
            }
        }
        self.queue = waiting;
        Ok(())
    }
}

/// Replays the pods through one policy on a fresh copy of the cluster.
///
/// A pod arrives at its creation time and is placed by the policy if some node fits it, else it
/// joins the queue. It runs for its own duration (deletion − creation) from when it actually
/// started, then frees its resources, and the queue is retried in order with backfill: a later
/// pod that fits starts even while the head still does not, so a large request at the head holds
/// nobody up (and may itself wait longer than under a strict FIFO).
///
/// `clock` gives the time elapsed since any fixed instant, for the decision rate; `seed` orders
/// the nodes for equal scores (and draws random fit's choices), as in the experiment.
pub fn replay_policy(
    cluster: &Cluster,
    pods: &[TimedPod],
    workload: &Workload,
    name: &str,
    seed: u64,
    clock: &dyn Fn() -> Duration,
) -> Result<Replay, ReplayError> {
    let policy = policies::by_name(name, workload, cluster.nodes.len())
        .ok_or_else(|| ReplayError::UnknownPolicy(name.to_owned()))?;
    let mut r = Replayer {
        pods,
        cluster: cluster.clone(),
        policy_name: policy.name(),
        policy,
        rng: SimRng::new(seed ^ 0x7E91_A75E_ED0F_71E5),
        rank: node_rank(cluster.nodes.len(), seed),
        events: pods
            .iter()
            .enumerate()
            .map(|(i, p)| Reverse((p.creation, ARRIVE, i)))
            .collect(),
        queue: Vec::new(),
        starts: vec![None; pods.len()],
        assignments: vec![None; pods.len()],
        allocated_milli: 0,
        decisions: 0,
    };
    let mut span: Option<(u64, u64)> = None;
    let mut gpu_milli_seconds = 0u128;
    let mut busy = Duration::ZERO;
    while let Some(Reverse((now, kind, i))) = r.events.pop() {
        let (first, last) = span.unwrap_or((now, now));
        gpu_milli_seconds += u128::from(r.allocated_milli) * u128::from(now - last);
        span = Some((first, now));
        let start = clock();
        if kind == ARRIVE {
            if !r.try_place(i, now)? {
                r.queue.push(i);
            }
        } else {
            r.depart(i, now)?;
        }
        busy += clock().saturating_sub(start);
    }
    r.cluster
        .check_invariants()
        .map_err(|source| ReplayError::InvalidRelease {
            policy: r.policy_name,
            source,
        })?;
    Ok(Replay {
        policy: r.policy_name,
        starts: r.starts,
        assignments: r.assignments,
        span: span.unwrap_or((0, 0)),
        gpu_milli_seconds,
        decisions: r.decisions,
        busy,
    })
}

impl Replay {
    /// The figures of the replay; `pods` and `cluster` are those it was run with.
    pub fn summary(&self, pods: &[TimedPod], cluster: &Cluster) -> ReplayRun {
        let mut waits: Vec<u64> = pods
            .iter()
            .zip(&self.starts)
            .filter_map(|(p, s)| s.map(|s| s - p.creation))
            .collect();
        waits.sort_unstable();
        let placed = waits.len() as u64;
        let mean_wait_s = if waits.is_empty() {
            0.0
        } else {
            waits.iter().map(|&w| w as f64).sum::<f64>() / waits.len() as f64
        };
        // Nearest rank: the smallest wait that at least 99% of the placed pods do not exceed.
        let p99_wait_s = match waits.len() {
            0 => 0.0,
            n => waits[(99 * n).div_ceil(100) - 1] as f64,
        };
        let (first, last) = self.span;
        let capacity = cluster.gpu_capacity_milli();
        let mean_gpu_allocation_ratio = if last > first && capacity > 0 {
            self.gpu_milli_seconds as f64 / (u128::from(capacity) * u128::from(last - first)) as f64
        } else {
            0.0
        };
        let secs = self.busy.as_secs_f64();
        ReplayRun {
            policy: self.policy,
            placed,
            never_placed: self.starts.len() as u64 - placed,
            mean_wait_s,
            p99_wait_s,
            mean_gpu_allocation_ratio,
            decisions: self.decisions,
            decisions_per_sec: if secs > 0.0 {
                self.decisions as f64 / secs
            } else {
                0.0
            },
        }
    }
}

/// Every named policy over the same pods; FGD's target workload is taken from them as in the
/// experiment.
pub fn run(
    cluster: &Cluster,
    pods: &[TimedPod],
    names: &[&str],
    seed: u64,
    clock: &dyn Fn() -> Duration,
) -> Result<Vec<ReplayRun>, ReplayError> {
    if pods.is_empty() {
        return Err(ReplayError::NoTimes);
    }
    let plain: Vec<Pod> = pods.iter().map(|p| p.pod.clone()).collect();
    let workload = Workload::from_pods(&plain, POPULARITY);
    names
        .iter()
        .map(|name| {
            replay_policy(cluster, pods, &workload, name, seed, clock)
                .map(|r| r.summary(pods, cluster))
        })
        .collect()
}

#[cfg(test)]
mod tests;
