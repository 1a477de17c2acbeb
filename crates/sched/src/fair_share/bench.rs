//! A deterministic queue and cluster for timing a pass with and without fair share; the
//! example `queue_pass` times them (this module takes no clock and prints nothing).

use std::num::NonZeroU64;

use super::{FairShare, Interval, Usage, DEFAULT_HALF_LIFE_S, MICRO_GPU};
use crate::queue::{PassOutcome, Pending, Queue, QueueConfig, Running, ON_DEMAND};
use crate::rng::SimRng;
use crate::{place, GpuSlot, Request};

/// GPUs per node of the bench cluster, and MiB per GPU.
pub const GPUS_PER_NODE: u32 = 8;
pub const GPU_MB: u64 = 81_920;

/// The time of the pass.
const NOW: i64 = 1_000_000;

/// A queue, the cluster under it and the accounts' standing, all drawn from one seed.
#[derive(Debug, Clone)]
pub struct BenchQueue {
    pub now: i64,
    pub gpus: Vec<GpuSlot>,
    pub running: Vec<Running>,
    pub queue: Queue,
    pub share: FairShare,
}

/// `jobs` queued items of `accounts` accounts (of uneven volume: account `a` submits about
/// `a + 1` times what account 0 does) over `nodes` nodes of [`GPUS_PER_NODE`] GPUs, some nine
/// tenths of it held by running work (spot and on-demand, most with an end time).
pub fn bench_queue(jobs: usize, nodes: u32, accounts: u64, seed: u64) -> BenchQueue {
    let mut rng = SimRng::new(seed);
    let mut gpus: Vec<GpuSlot> = (0..nodes)
        .flat_map(|n| {
            (0..GPUS_PER_NODE).map(move |g| GpuSlot {
                node: n,
                vram_mb: GPU_MB,
                free_mb: GPU_MB,
                switch: Some(g / 4),
            })
        })
        .collect();
    let capacity = gpus.len() as u64 * GPU_MB;
    let mut held = 0u64;
    let mut running = Vec::new();
    let mut misses = 0;
    // Fill the cluster at random until nine tenths are held or nothing more fits.
    while held * 10 < capacity * 9 && misses < 100 {
        let request = draw_request(&mut rng);
        let Ok(p) = place(&gpus, &request) else {
            misses += 1;
            continue;
        };
        for &(g, mb) in &p.gpus {
            gpus[g].free_mb -= mb;
            held += mb;
        }
        let id = running.len() as u64;
        let spot = rng.below(10) < 7;
        running.push(Running {
            id,
            priority: if spot { draw_bid(&mut rng) } else { ON_DEMAND },
            value: draw_bid(&mut rng),
            started_at: NOW - to_i64(rng.below(86_400)),
            ends_at: (rng.below(10) < 9).then(|| NOW + 60 + to_i64(rng.below(86_400))),
            holds: p.gpus,
            borrowed_of: None,
        });
    }
    let mut queue = Queue::new(QueueConfig::default());
    let volume: u64 = (1..=accounts).sum();
    for id in 0..jobs as u64 {
        // Account a with probability (a + 1) / volume.
        let mut pick = rng.below(volume.max(1));
        let mut account = 0;
        while pick > account {
            pick -= account + 1;
            account += 1;
        }
        let item = Pending {
            id,
            request: draw_request(&mut rng),
            priority: if rng.below(10) < 8 {
                draw_bid(&mut rng)
            } else {
                ON_DEMAND
            },
            enqueued_at: NOW - to_i64(rng.below(86_400)),
            duration_s: (rng.below(10) < 9).then(|| 600 + rng.below(86_400)),
            account,
            guaranteed: false,
        };
        // Ids are distinct and requests never empty: push cannot refuse.
        let _ = queue.push(item);
    }
    let half_life = NonZeroU64::new(DEFAULT_HALF_LIFE_S).unwrap_or(NonZeroU64::MIN);
    let mut share = FairShare::new();
    for account in 0..accounts {
        let usage = Usage::default().add(
            &Interval {
                micro_gpus: (1 + rng.below(64)) * MICRO_GPU,
                start_s: NOW - to_i64(rng.below(30 * 86_400)),
                end_s: None,
            },
            NOW,
            half_life,
        );
        // Weights are positive and usage finite: set cannot refuse.
        let _ = share.set(account, 1 + rng.below(4), usage.value);
    }
    BenchQueue {
        now: NOW,
        gpus,
        running,
        queue,
        share,
    }
}

impl BenchQueue {
    /// One pass over a copy of the queue: today's order, or fair share's.
    pub fn pass(&self, fair: bool) -> PassOutcome {
        let mut queue = self.queue.clone();
        if fair {
            queue.pass_fair(self.now, &self.gpus, &self.running, &self.share, |_, _| {
                true
            })
        } else {
            queue.pass(self.now, &self.gpus, &self.running)
        }
    }

    /// The order alone, without the walk: today's sort, or fair share's order drained with
    /// every item charged as if placed. Returns a checksum of the order, so that it is used.
    pub fn order_only(&self, fair: bool) -> u64 {
        let items: Vec<Pending> = self.queue.iter().cloned().collect();
        let config = *self.queue.config();
        let mut sum = 0u64;
        let mut step = 0u64;
        let mut visit = |i: usize| {
            step += 1;
            sum = sum.wrapping_mul(31).wrapping_add(i as u64 ^ step);
        };
        if fair {
            let mut order = self.share.order(&items, &config, self.now);
            while let Some(i) = order.next_item() {
                visit(i);
                let micro = match items[i].request {
                    Request::Whole { count } => u64::from(count) * MICRO_GPU,
                    Request::Share { vram_mb } => vram_mb * MICRO_GPU / GPU_MB,
                };
                order.placed(self.share.charge(micro, items[i].duration_s));
            }
        } else {
            let mut order: Vec<usize> = (0..items.len()).collect();
            order.sort_by_cached_key(|&i| config.walk_key(&items[i], self.now));
            order.into_iter().for_each(visit);
        }
        sum
    }
}

fn draw_request(rng: &mut SimRng) -> Request {
    match rng.below(20) {
        0..=11 => Request::Whole { count: 1 },
        12..=14 => Request::Whole { count: 2 },
        15..=16 => Request::Whole { count: 4 },
        17 => Request::Whole { count: 8 },
        _ => Request::Share {
            vram_mb: 8_192 * (1 + rng.below(5)),
        },
    }
}

/// A spot bid in micro-units per GPU-hour.
fn draw_bid(rng: &mut SimRng) -> i64 {
    to_i64(100_000 + rng.below(4_000_000))
}

fn to_i64(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}
