//! Fair share on the Alibaba trace: its GPU pods dealt to synthetic teams of uneven volume and
//! replayed through the live queue, for each team's share of the GPU-hours against its target.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::num::NonZeroU64;

use crate::cluster::{Cluster, GpuDemand, MILLI};
use crate::fair_share::{FairShare, FairShareError, Interval, Usage};
use crate::queue::{Pending, Queue, QueueConfig, Running, ON_DEMAND};
use crate::replay::TimedPod;
use crate::rng::SimRng;
use crate::{GpuSlot, Request};

#[cfg(test)]
mod tests;

/// The teams and how the replay treats them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairReplaySetup {
    /// Each team's weight (its quota): team `i`'s target share is `weights[i] / Σ weights`.
    pub weights: Vec<u64>,
    /// Each team's submission volume: a pod goes to team `i` with probability
    /// `volumes[i] / Σ volumes`, drawn from a hash of the seed and the pod's index.
    pub volumes: Vec<u64>,
    pub half_life_s: NonZeroU64,
    /// How much faster than the trace pods arrive: a pod created `t` seconds after the first is
    /// queued `t / speedup` seconds after it (durations stay). Above 1 it turns the trace's
    /// bursts into a sustained backlog, where the order of the queue decides who runs.
    pub speedup: NonZeroU64,
    /// Whether the passes use fair share; without it, today's order by priority and age.
    pub fair: bool,
    pub seed: u64,
}

/// One team's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamShare {
    pub team: u64,
    pub weight: u64,
    /// Its weight over the total weight.
    pub target: f64,
    /// Pods dealt to it.
    pub pods: usize,
    /// GPU-hours it ran over the whole replay.
    pub gpu_hours: f64,
    /// Its share of the GPU-hours run while every team had backlog (0 when that never
    /// happened): where fair share decides, this is what should meet the target. A team has
    /// backlog when the GPUs of its waiting work would fill its target share of the cluster, so
    /// that it could use its whole share if the queue gave it.
    pub backlogged_share: f64,
}

/// What the replay found.
#[derive(Debug, Clone, PartialEq)]
pub struct FairReplay {
    pub teams: Vec<TeamShare>,
    /// Seconds during which every team had backlog (see [`TeamShare::backlogged_share`]).
    pub backlogged_s: u64,
    /// Passes of the queue: one at each second with an arrival or a departure.
    pub passes: u64,
    /// Pods replayed: those that ask for GPUs.
    pub replayed: usize,
    /// Pods still waiting when nothing was left running: no node of the cluster admits them.
    pub never_placed: usize,
}

/// What the replay refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FairReplayError {
    #[error("no teams: give at least one weight")]
    NoTeams,
    #[error("{weights} weights but {volumes} volumes: give one of each per team")]
    Mismatch { weights: usize, volumes: usize },
    #[error("the teams' volumes add up to zero: no pod could be dealt")]
    NoVolume,
    #[error("team {team} has weight zero")]
    ZeroWeight { team: u64 },
    #[error("the standing of team {team} was refused")]
    Standing {
        team: u64,
        #[source]
        source: FairShareError,
    },
}

/// One GPU of the cluster, in the queue's terms: memory is milli-GPU (a GPU has [`MILLI`]).
fn slots(cluster: &Cluster) -> Vec<GpuSlot> {
    let mut slots = Vec::new();
    for (n, node) in cluster.nodes.iter().enumerate() {
        for _ in &node.gpu_free {
            slots.push(GpuSlot {
                node: u32::try_from(n).unwrap_or(u32::MAX),
                vram_mb: u64::from(MILLI),
                free_mb: u64::from(MILLI),
                switch: None,
            });
        }
    }
    slots
}

/// The team of pod `index`.
fn team_of(index: usize, volumes: &[u64], total: u64, seed: u64) -> u64 {
    let mut pick = SimRng::new(seed.wrapping_add(index as u64)).below(total);
    for (team, &v) in (0u64..).zip(volumes) {
        if pick < v {
            return team;
        }
        pick -= v;
    }
    0
}

/// A pod the queue is running.
#[derive(Debug)]
struct Run {
    team: usize,
    started_at: i64,
    ends_at: i64,
    holds: Vec<(usize, u64)>,
}

/// Replays the GPU pods of `pods` on `cluster` through [`Queue`] (CPU and memory are not
/// modelled: only the GPUs, as the live queue sees them; a pod's model constraint is kept).
///
/// Each pod is queued at its creation time as on-demand work of its team, with its duration
/// (deletion − creation) known; after every second with an arrival or a departure the queue
/// makes one pass, with fair share or without. A placed pod runs for its duration from then.
/// Each team's usage for fair share is its GPU-seconds decayed with the half-life, kept
/// as a running figure from the replayed allocations.
pub fn replay_fair_share(
    cluster: &Cluster,
    pods: &[TimedPod],
    setup: &FairReplaySetup,
) -> Result<FairReplay, FairReplayError> {
    let teams = setup.weights.len();
    if teams == 0 {
        return Err(FairReplayError::NoTeams);
    }
    if setup.volumes.len() != teams {
        return Err(FairReplayError::Mismatch {
            weights: teams,
            volumes: setup.volumes.len(),
        });
    }
    if let Some(team) = (0u64..).zip(&setup.weights).find(|(_, &w)| w == 0) {
        return Err(FairReplayError::ZeroWeight { team: team.0 });
    }
    let total_volume = setup.volumes.iter().fold(0u64, |a, &v| a.saturating_add(v));
    if total_volume == 0 {
        return Err(FairReplayError::NoVolume);
    }

    let mut slots = slots(cluster);
    let capacity: u64 = slots.iter().map(|s| s.vram_mb).sum();
    let total_weight = setup.weights.iter().map(|&w| u128::from(w)).sum::<u128>();
    let first = pods.iter().map(|p| p.creation).min().unwrap_or(0);
    let mut arrivals: Vec<(i64, usize, Request)> = pods
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let request = match p.pod.gpu {
                GpuDemand::None | GpuDemand::Share(0) | GpuDemand::Whole(0) => return None,
                GpuDemand::Share(m) => Request::Share {
                    vram_mb: u64::from(m),
                },
                GpuDemand::Whole(count) => Request::Whole { count },
            };
            let at = first + (p.creation - first) / setup.speedup.get();
            Some((to_i64(at), i, request))
        })
        .collect();
    arrivals.sort_by_key(|&(t, i, _)| (t, i));
    let team_of_pod: Vec<u64> = (0..pods.len())
        .map(|i| team_of(i, &setup.volumes, total_volume, setup.seed))
        .collect();

    let mut queue = Queue::new(QueueConfig::default());
    let mut running: BTreeMap<u64, Run> = BTreeMap::new();
    let mut departures: BinaryHeap<Reverse<(i64, u64)>> = BinaryHeap::new();
    let mut usage = vec![Usage::default(); teams];
    let mut allocated = vec![0u64; teams]; // milli-GPU, now
    let mut ran = vec![0u128; teams]; // milli-GPU-seconds, overall
    let mut ran_backlogged = vec![0u128; teams];
    let mut backlogged = false;
    let mut backlogged_s = 0u64;
    let mut passes = 0u64;
    let mut last: Option<i64> = None;
    let mut next_arrival = 0;

    loop {
        let arrival = arrivals.get(next_arrival).map(|a| a.0);
        let departure = departures.peek().map(|Reverse((t, _))| *t);
        let now = match (arrival, departure) {
            (Some(a), Some(d)) => a.min(d),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => break,
        };
        // What ran since the last pass, at the allocation that pass left.
        if let Some(last) = last {
            let seconds = u64::try_from(now - last).unwrap_or(0);
            for team in 0..teams {
                let milli_s = u128::from(allocated[team]) * u128::from(seconds);
                ran[team] += milli_s;
                if backlogged {
                    ran_backlogged[team] += milli_s;
                }
                let interval = Interval {
                    micro_gpus: allocated[team] * 1_000,
                    start_s: last,
                    end_s: Some(now),
                };
                usage[team] = usage[team].add(&interval, now, setup.half_life_s);
            }
            if backlogged {
                backlogged_s += seconds;
            }
        }
        last = Some(now);
        while let Some(&Reverse((t, id))) = departures.peek() {
            if t > now {
                break;
            }
            departures.pop();
            if let Some(run) = running.remove(&id) {
                for &(g, mb) in &run.holds {
                    slots[g].free_mb += mb;
                    allocated[run.team] -= mb;
                }
            }
        }
        while let Some(&(t, i, request)) = arrivals.get(next_arrival) {
            if t > now {
                break;
            }
            next_arrival += 1;
            // Pod indices are distinct and requests never empty: push cannot refuse.
            let _ = queue.push(Pending {
                id: i as u64,
                request,
                priority: ON_DEMAND,
                enqueued_at: t,
                duration_s: Some(pods[i].duration),
                account: team_of_pod[i],
                guaranteed: false,
            });
        }

        let live: Vec<Running> = running
            .iter()
            .map(|(&id, r)| Running {
                id,
                priority: ON_DEMAND,
                value: 0,
                started_at: r.started_at,
                ends_at: Some(r.ends_at),
                holds: r.holds.clone(),
                borrowed_of: None,
            })
            .collect();
        let allowed = |item: &Pending, g: usize| {
            let pod = usize::try_from(item.id).ok().and_then(|i| pods.get(i));
            let node = slots
                .get(g)
                .and_then(|s| cluster.nodes.get(s.node as usize));
            matches!((pod, node), (Some(p), Some(n)) if n.accessible(&p.pod))
        };
        let outcome = if setup.fair {
            let mut share = FairShare::new();
            for (team, (&weight, u)) in (0u64..).zip(setup.weights.iter().zip(&usage)) {
                share
                    .set(team, weight, u.value)
                    .map_err(|source| FairReplayError::Standing { team, source })?;
            }
            queue.pass_fair(now, &slots, &live, &share, allowed)
        } else {
            queue.pass_with(now, &slots, &live, allowed)
        };
        passes += 1;
        for placed in outcome.placed {
            let team = usize::try_from(placed.item.account).unwrap_or(0);
            for &(g, mb) in &placed.placement.gpus {
                slots[g].free_mb -= mb;
                allocated[team] += mb;
            }
            let ends_at = now.saturating_add(to_i64(placed.item.duration_s.unwrap_or(0)));
            departures.push(Reverse((ends_at, placed.item.id)));
            running.insert(
                placed.item.id,
                Run {
                    team,
                    started_at: now,
                    ends_at,
                    holds: placed.placement.gpus,
                },
            );
        }
        // Milli-GPU each team has waiting; it has backlog when that would fill its share.
        let mut waiting = vec![0u64; teams];
        for p in queue.iter() {
            let milli = match p.request {
                Request::Whole { count } => u64::from(count) * u64::from(MILLI),
                Request::Share { vram_mb } => vram_mb,
            };
            if let Some(w) = usize::try_from(p.account)
                .ok()
                .and_then(|t| waiting.get_mut(t))
            {
                *w += milli;
            }
        }
        backlogged = waiting.iter().zip(&setup.weights).all(|(&w, &weight)| {
            u128::from(w) * total_weight >= u128::from(capacity) * u128::from(weight)
        });
    }

    let total_backlogged: u128 = ran_backlogged.iter().sum();
    let teams = (0u64..)
        .zip(&setup.weights)
        .enumerate()
        .map(|(i, (team, &weight))| TeamShare {
            team,
            weight,
            target: weight as f64 / total_weight as f64,
            pods: arrivals
                .iter()
                .filter(|&&(_, p, _)| team_of_pod[p] == team)
                .count(),
            gpu_hours: ran[i] as f64 / f64::from(MILLI) / 3600.0,
            backlogged_share: if total_backlogged == 0 {
                0.0
            } else {
                ran_backlogged[i] as f64 / total_backlogged as f64
            },
        })
        .collect();
    Ok(FairReplay {
        teams,
        backlogged_s,
        passes,
        replayed: arrivals.len(),
        never_placed: queue.len(),
    })
}

fn to_i64(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}
