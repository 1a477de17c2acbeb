//! Fair share between accounts (teams), as in Slurm's classic fair-share: GPU use decayed with a
//! half-life, and the order in which a queue pass serves the account furthest below its share.
//!
//! Usage is in `f64` GPU-seconds: it is a figure for ordering, never money, and a decayed
//! integral has no exact integer form anyway. Everything here is deterministic: the same figures
//! in give the same order out, bit for bit.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::f64::consts::LN_2;
use std::num::NonZeroU64;

use crate::plan::{ON_DEMAND, RESERVED};
use crate::queue::{Pending, QueueConfig};
use crate::{GpuSlot, Placement};

pub mod bench;
#[cfg(test)]
mod tests;

/// Micro-GPUs in one GPU: a whole GPU is `MICRO_GPU`, a share counts as its fraction.
pub const MICRO_GPU: u64 = 1_000_000;

/// The weight of an account that has no quota (or no entry in a [`FairShare`]).
pub const DEFAULT_WEIGHT: u64 = 1;

/// Slurm's default half-life of usage: seven days.
pub const DEFAULT_HALF_LIFE_S: u64 = 7 * 24 * 3600;

/// What a placed item of unknown duration is charged for, in seconds: one hour. The charge only
/// keeps one pass from handing everything to one account; the usage the caller reports for the
/// next pass counts what the work really ran.
pub const NOMINAL_DURATION_S: u64 = 3600;

/// A stretch of GPU use at a constant rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// GPUs in use, in micro-GPUs ([`MICRO_GPU`] is one whole GPU).
    pub micro_gpus: u64,
    pub start_s: i64,
    /// When it ended; `None` while it still runs (it counts until `now`).
    pub end_s: Option<i64>,
}

/// GPU-seconds of `intervals`, each second weighted by `2^(-(now - t) / half_life_s)`: a
/// GPU-second an hour ago counts fully, one a half-life ago half. Whatever lies after `now`
/// does not count. Exact up to `f64` rounding: each interval `[a, b]` at `r` GPUs adds the
/// closed form `r × h/ln 2 × (2^(-(now-b)/h) − 2^(-(now-a)/h))`, computed with `exp_m1` so that
/// a short interval keeps its precision.
pub fn decayed_gpu_seconds(intervals: &[Interval], now: i64, half_life_s: NonZeroU64) -> f64 {
    intervals
        .iter()
        .map(|i| decayed_interval(i, now, half_life_s))
        .sum()
}

fn decayed_interval(interval: &Interval, now: i64, half_life_s: NonZeroU64) -> f64 {
    let end = interval.end_s.unwrap_or(now).min(now);
    let start = interval.start_s.min(end);
    if interval.micro_gpus == 0 || start == end {
        return 0.0;
    }
    let rate = LN_2 / half_life_s.get() as f64;
    let gpus = interval.micro_gpus as f64 / MICRO_GPU as f64;
    // In i128, so that no two i64 times overflow when subtracted.
    let since_end = (i128::from(now) - i128::from(end)) as f64;
    let length = (i128::from(end) - i128::from(start)) as f64;
    gpus * (-rate * since_end).exp() * -(-rate * length).exp_m1() / rate
}

/// A running figure of decayed usage: `value` GPU-seconds as of `at`. Decaying it to a later
/// time and adding the intervals since gives what [`decayed_gpu_seconds`] gives over them all.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Decayed GPU-seconds.
    pub value: f64,
    pub at: i64,
}

impl Usage {
    /// The figure as of `now`. Time does not run back: a `now` before `at` changes nothing.
    pub fn decayed_to(self, now: i64, half_life_s: NonZeroU64) -> Usage {
        if now <= self.at {
            return self;
        }
        let elapsed = (i128::from(now) - i128::from(self.at)) as f64;
        Usage {
            value: self.value * (-elapsed / half_life_s.get() as f64).exp2(),
            at: now,
        }
    }

    /// The figure as of `now` with `interval` added (what of it lies before `now`). To keep a
    /// running figure, add each stretch of use once: what ran from the last update to `now`.
    pub fn add(self, interval: &Interval, now: i64, half_life_s: NonZeroU64) -> Usage {
        let u = self.decayed_to(now, half_life_s);
        Usage {
            value: u.value + decayed_interval(interval, u.at, half_life_s),
            at: u.at,
        }
    }
}

/// What fair share refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FairShareError {
    #[error("account {account} has weight zero: a share needs a positive weight")]
    ZeroWeight { account: u64 },
    #[error(
        "account {account} has usage {usage}: usage is a finite number of GPU-seconds, at least 0"
    )]
    BadUsage { account: u64, usage: f64 },
}

/// One account's standing: its weight (its share is its weight over the total weight of the
/// accounts with queued work) and its decayed usage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccountShare {
    pub weight: u64,
    /// Decayed GPU-seconds as of the pass (see [`Usage`]).
    pub usage: f64,
}

impl Default for AccountShare {
    fn default() -> Self {
        Self {
            weight: DEFAULT_WEIGHT,
            usage: 0.0,
        }
    }
}

/// Weights and usage per account (team), for [`crate::queue::Queue::pass_fair`].
///
/// # Rules
/// - **Share.** An account's share is its weight over the total weight of the accounts that
///   have work in the queue. An account without an entry (a team without a quota) has weight
///   [`DEFAULT_WEIGHT`] and no usage.
/// - **Standing.** Its normalised usage is `usage / share` ([`normalised_usage`]); the lower,
///   the further below its share. The account with the lowest goes next, the lower account id
///   on a tie.
/// - **Charge.** Each item placed in a pass charges its account, at once, with its GPUs times
///   its duration ([`NOMINAL_DURATION_S`] when unknown, see
///   [`FairShare::with_nominal_duration`]), so one pass does not give everything to the account
///   that was furthest below. An item left waiting charges nothing. The charges live for one
///   pass: the next starts from the usage the caller reports then.
/// - **Tiers.** Tiers come before fair share ([`tier_class`]): reserved blocks, then on-demand
///   work, then spot bids; fair share orders the accounts within a tier. Within an account's
///   tier, and for preemption, priorities decide as without fair share.
#[derive(Debug, Clone, PartialEq)]
pub struct FairShare {
    accounts: HashMap<u64, AccountShare>,
    nominal_duration_s: u64,
}

impl Default for FairShare {
    fn default() -> Self {
        Self::new()
    }
}

impl FairShare {
    pub fn new() -> Self {
        Self {
            accounts: HashMap::new(),
            nominal_duration_s: NOMINAL_DURATION_S,
        }
    }

    /// The charge of a placed item of unknown duration: it counts as running this long.
    pub fn with_nominal_duration(self, seconds: u64) -> Self {
        Self {
            nominal_duration_s: seconds,
            ..self
        }
    }

    /// Sets an account's weight and decayed usage (GPU-seconds as of the pass).
    pub fn set(&mut self, account: u64, weight: u64, usage: f64) -> Result<(), FairShareError> {
        if weight == 0 {
            return Err(FairShareError::ZeroWeight { account });
        }
        if !(usage.is_finite() && usage >= 0.0) {
            return Err(FairShareError::BadUsage { account, usage });
        }
        self.accounts
            .insert(account, AccountShare { weight, usage });
        Ok(())
    }

    /// The account's standing; the default one for an account without an entry.
    pub fn account(&self, account: u64) -> AccountShare {
        self.accounts.get(&account).copied().unwrap_or_default()
    }

    pub fn nominal_duration_s(&self) -> u64 {
        self.nominal_duration_s
    }

    /// The GPU-seconds a placed item is charged: `micro_gpus` (see [`placed_micro_gpus`]) times
    /// its duration, or the nominal duration when it has none.
    pub fn charge(&self, micro_gpus: u64, duration_s: Option<u64>) -> f64 {
        let seconds = duration_s.unwrap_or(self.nominal_duration_s);
        micro_gpus as f64 / MICRO_GPU as f64 * seconds as f64
    }

    /// The order of a pass over `items` at `now`, started with every account at its standing.
    /// Tiers come first (reserved, then on-demand, then spot: [`tier_class`]); within a tier,
    /// the account furthest below its share. `O(Q log Q)` to build.
    pub fn order(&self, items: &[Pending], config: &QueueConfig, now: i64) -> FairOrder {
        // One sort by tier and account, then the walk order: each (tier, account) is a run.
        let lane_of = |i: usize| (Reverse(tier_class(items[i].priority)), items[i].account);
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_cached_key(|&i| (lane_of(i), config.walk_key(&items[i], now)));
        let mut accounts: Vec<(u64, AccountShare)> = Vec::new();
        let mut slot_of: HashMap<u64, usize> = HashMap::new();
        let mut lanes: Vec<Lane> = Vec::new();
        let mut start = 0;
        for run in order.chunk_by(|&a, &b| lane_of(a) == lane_of(b)) {
            let account = items[run[0]].account;
            let slot = *slot_of.entry(account).or_insert_with(|| {
                accounts.push((account, self.account(account)));
                accounts.len() - 1
            });
            lanes.push(Lane {
                class: tier_class(items[run[0]].priority),
                account,
                slot,
                next: start,
                end: start + run.len(),
            });
            start += run.len();
        }
        let total_weight = accounts
            .iter()
            .map(|(_, a)| u128::from(a.weight))
            .sum::<u128>() as f64;
        let shares: Vec<AccountShare> = accounts.iter().map(|(_, a)| *a).collect();
        let heap = lanes
            .iter()
            .enumerate()
            .map(|(lane, l)| Turn::new(l, lane, &shares, total_weight))
            .collect();
        FairOrder {
            order,
            lanes,
            shares,
            heap,
            total_weight,
            current: None,
        }
    }
}

/// `usage / (weight / total_weight)`: the usage of an account per unit of its share. The lower,
/// the further the account is below its share.
pub fn normalised_usage(usage: f64, weight: u64, total_weight: f64) -> f64 {
    usage * total_weight / weight as f64
}

/// The micro-GPUs a placement holds: a whole GPU counts [`MICRO_GPU`], a share of `mb` out of
/// `vram_mb` its fraction (rounded down). `gpus` are the slots the placement indexes.
pub fn placed_micro_gpus(gpus: &[GpuSlot], placement: &Placement) -> u64 {
    placement
        .gpus
        .iter()
        .map(|&(g, mb)| match gpus.get(g) {
            Some(s) if s.vram_mb > 0 => {
                let micro =
                    u128::from(mb.min(s.vram_mb)) * u128::from(MICRO_GPU) / u128::from(s.vram_mb);
                u64::try_from(micro).unwrap_or(MICRO_GPU)
            }
            _ => 0,
        })
        .fold(0u64, u64::saturating_add)
}

/// The tier of a base priority, highest first in a fair pass: 2 reserved, 1 on-demand (and
/// stepped), 0 spot. Fair share orders accounts within a tier, never across: an account's spot
/// bid does not go before another's on-demand work.
pub fn tier_class(priority: i64) -> u8 {
    if priority >= RESERVED {
        2
    } else if priority >= ON_DEMAND {
        1
    } else {
        0
    }
}

/// One account's items of one tier in a pass, best first.
#[derive(Debug)]
struct Lane {
    class: u8,
    account: u64,
    /// Its account's index in `FairOrder::shares` (shared by its lanes of every tier).
    slot: usize,
    /// Its items not yet handed out: `FairOrder::order[next..end]`.
    next: usize,
    end: usize,
}

/// A lane's place in the heap: the higher tier first, then the lowest normalised usage, then the
/// lower account id.
#[derive(Debug, Clone, Copy)]
struct Turn {
    class: u8,
    normalised: f64,
    account: u64,
    lane: usize,
}

impl Turn {
    fn new(lane: &Lane, index: usize, shares: &[AccountShare], total_weight: f64) -> Self {
        let a = shares[lane.slot];
        Turn {
            class: lane.class,
            normalised: normalised_usage(a.usage, a.weight, total_weight),
            account: lane.account,
            lane: index,
        }
    }
}

impl Ord for Turn {
    /// Reversed but for the tier, so that `BinaryHeap`, a max-heap, pops the highest tier's
    /// account furthest below its share.
    fn cmp(&self, other: &Self) -> Ordering {
        self.class
            .cmp(&other.class)
            .then(other.normalised.total_cmp(&self.normalised))
            .then(other.account.cmp(&self.account))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Turn {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Turn {}

/// The fair-share order of one pass, decided one item at a time: [`FairOrder::next_item`] gives the
/// best item of the account furthest below its share that still has one, and
/// [`FairOrder::placed`] charges that account when the item was placed. `O(log A)` a step with
/// `A` accounts.
#[derive(Debug)]
pub struct FairOrder {
    /// Item indices by tier and account, each lane's best first.
    order: Vec<usize>,
    lanes: Vec<Lane>,
    /// Each account's weight and usage, charged as its items are placed.
    shares: Vec<AccountShare>,
    heap: BinaryHeap<Turn>,
    total_weight: f64,
    /// The lane of the item last handed out: out of the heap until its charge is known.
    current: Option<usize>,
}

impl FairOrder {
    /// The next item to walk (an index into the items the order was built over). Not an
    /// iterator: [`FairOrder::placed`] must be told of a placement before the next step.
    pub fn next_item(&mut self) -> Option<usize> {
        // The last lane back in, at its charged standing.
        if let Some(index) = self.current.take() {
            if self.lanes[index].next < self.lanes[index].end {
                let turn = Turn::new(&self.lanes[index], index, &self.shares, self.total_weight);
                self.heap.push(turn);
            }
        }
        let lane = {
            loop {
                // A lane whose account was charged in another tier since it was pushed stands
                // lower than its entry says (usage only grows): pushed again as it is now.
                let top = self.heap.pop()?;
                let now = Turn::new(
                    &self.lanes[top.lane],
                    top.lane,
                    &self.shares,
                    self.total_weight,
                );
                if now.normalised.total_cmp(&top.normalised) == Ordering::Equal
                    || self.heap.peek().is_none_or(|next| now >= *next)
                {
                    break top.lane;
                }
                self.heap.push(now);
            }
        };
        let l = &mut self.lanes[lane];
        let item = self.order.get(l.next).copied()?;
        l.next += 1;
        self.current = Some(lane);
        Some(item)
    }

    /// Charges the account of the item last handed out with `gpu_seconds`.
    pub fn placed(&mut self, gpu_seconds: f64) {
        if let Some(lane) = self.current {
            self.shares[self.lanes[lane].slot].usage += gpu_seconds;
        }
    }

    /// The total weight of the accounts with queued work: the denominator of every share.
    pub fn total_weight(&self) -> f64 {
        self.total_weight
    }

    /// Where each account stands now: (account, normalised usage), by account id.
    pub fn standings(&self) -> Vec<(u64, f64)> {
        let mut out: Vec<(u64, f64)> = self
            .lanes
            .iter()
            .map(|l| {
                let a = self.shares[l.slot];
                (
                    l.account,
                    normalised_usage(a.usage, a.weight, self.total_weight),
                )
            })
            .collect();
        out.sort_unstable_by_key(|&(a, _)| a);
        out.dedup_by_key(|&mut (a, _)| a);
        out
    }
}
