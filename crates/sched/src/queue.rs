//! The live scheduler's queue: priorities with aging, EASY backfill and spot preemption.

use std::cmp::Reverse;

use self::pass::Pass;
use crate::fair_share::{placed_micro_gpus, FairOrder, FairShare};
pub use crate::plan::{ON_DEMAND, RESERVED};
use crate::{place, GpuSlot, NoFit, Placement, Request};

mod pass;
#[cfg(test)]
mod tests;

/// How the queue orders and preempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Priority points gained per second of waiting. The default, 1,000, makes an hour of
    /// waiting worth a spot bid 3.6 currency units per GPU-hour higher: aging reorders spot
    /// bids within minutes to hours, but never in practice lifts spot over on-demand (the tiers
    /// are [`ON_DEMAND`] apart: some 30,000 years of waiting). Zero turns aging off.
    pub aging_per_second: u64,
    /// Base priorities at or above this may preempt; running work below it is spot and may
    /// be preempted.
    pub preempt_from: i64,
    /// Whether a spot item may also preempt spot instances of strictly lower bids (what the
    /// store's immediate `preempt_for` does); off by default, so only on-demand and reserved
    /// work preempts from the queue.
    pub spot_preempts_lower_bids: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            aging_per_second: 1_000,
            preempt_from: ON_DEMAND,
            spot_preempts_lower_bids: false,
        }
    }
}

impl QueueConfig {
    /// `base + waited seconds × aging_per_second`, exact (in `i128`, so it never saturates).
    pub fn effective_priority(&self, item: &Pending, now: i64) -> i128 {
        let waited = now.saturating_sub(item.enqueued_at).max(0);
        i128::from(item.priority) + i128::from(waited) * i128::from(self.aging_per_second)
    }

    /// Where an item comes in the walk, smallest first: effective priority (highest first), then
    /// the older enqueue, then the lower id. Under fair share, the order within one account.
    pub fn walk_key(&self, item: &Pending, now: i64) -> (Reverse<i128>, i64, u64) {
        (
            Reverse(self.effective_priority(item, now)),
            item.enqueued_at,
            item.id,
        )
    }

    /// Whether `item` may preempt spot work of lower bids.
    fn may_preempt_spot(&self, item: &Pending) -> bool {
        item.priority >= self.preempt_from || self.spot_preempts_lower_bids
    }

    /// Whether `item` may preempt `run`: spot work of a lower bid, or, for work within its
    /// quota, another account's borrowed work.
    fn may_take(&self, item: &Pending, run: &Running) -> bool {
        let spot = self.may_preempt_spot(item)
            && self.is_spot(run.priority)
            && run.priority < item.priority;
        let reclaim = item.guaranteed && run.borrowed_of.is_some_and(|a| a != item.account);
        spot || reclaim
    }

    fn is_spot(&self, priority: i64) -> bool {
        priority < self.preempt_from
    }
}

/// A reservation waiting for GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub id: u64,
    pub request: Request,
    /// Base priority: a spot bid in micro-units per GPU-hour, or [`ON_DEMAND`], [`RESERVED`].
    pub priority: i64,
    /// When it was queued, in seconds (the same clock as `now`).
    pub enqueued_at: i64,
    /// How long it will run once started, when known (reservations have a length).
    pub duration_s: Option<u64>,
    /// The account (team) whose fair share it draws on; only [`Queue::pass_fair`] reads it.
    /// Callers without fair share pass 0; under fair share, work of no team should get an
    /// account of its own per tenant, distinct from every team's.
    pub account: u64,
    /// Within its account's quota of the GPU type it asks for: it may take back other
    /// accounts' borrowed work ([`Running::borrowed_of`]), whatever its tier.
    pub guaranteed: bool,
}

/// A running instance as the queue sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub id: u64,
    /// Base priority, as for [`Pending::priority`].
    pub priority: i64,
    /// What preempting it loses per hour (its price per hour).
    pub value: i64,
    pub started_at: i64,
    /// When it is expected to end; `None` for open-ended work.
    pub ends_at: Option<i64>,
    /// (index into the GPU slice, MiB it holds there); already subtracted from `free_mb`.
    pub holds: Vec<(usize, u64)>,
    /// `Some(account)` for work borrowed beyond its account's quota (never a reserved block):
    /// guaranteed work of another account takes it first, as if it bid nothing.
    pub borrowed_of: Option<u64>,
}

/// What the queue refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("reservation {id} is already queued")]
    Duplicate { id: u64 },
    #[error("reservation {id} asks for zero GPUs or zero memory")]
    Empty { id: u64 },
}

/// Why a pending item was not placed in a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// It does not fit the GPUs as they were before the pass (and preempting did not help).
    NoFit(NoFit),
    /// It fitted before the pass, but items ahead of it took the room.
    BehindHigherPriority,
    /// It fits now, but would hold room reserved for the head past the head's start.
    ReservedForHead { head: u64, until: i64 },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::NoFit(no_fit) => write!(f, "{no_fit}"),
            Reason::BehindHigherPriority => f.write_str("waiting behind higher priority"),
            Reason::ReservedForHead { head, until } => {
                write!(
                    f,
                    "reserved for the head (reservation {head}) until {until}"
                )
            }
        }
    }
}

/// An item placed by a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The item, out of the queue: push it back if committing the placement fails.
    pub item: Pending,
    pub placement: Placement,
    /// Running instances that must stop first to free its room (ids of [`Running`]).
    pub preempts: Vec<u64>,
    /// Whether it started ahead of a head that is still waiting.
    pub backfilled: bool,
}

/// The head's reservation: when it is expected to start and on which GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub id: u64,
    pub start_at: i64,
    pub gpus: Vec<(usize, u64)>,
}

/// What one pass decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassOutcome {
    /// In the order they were placed.
    pub placed: Vec<Placed>,
    /// Every running instance to stop (the union of the `preempts` of `placed`).
    pub preempted: Vec<u64>,
    /// Every item still queued, in walk order, with why it waits.
    pub waiting: Vec<(u64, Reason)>,
    pub head: Option<Head>,
}

impl PassOutcome {
    pub fn placement(&self, id: u64) -> Option<&Placement> {
        self.placed
            .iter()
            .find(|p| p.item.id == id)
            .map(|p| &p.placement)
    }

    pub fn reason(&self, id: u64) -> Option<&Reason> {
        self.waiting.iter().find(|(i, _)| *i == id).map(|(_, r)| r)
    }
}

/// The pending reservations, in no particular order between passes.
///
/// # Rules
/// - **Order.** A pass walks the queue by effective priority, highest first (ties: the older
///   enqueue first, then the lower id). Effective priority is
///   `base + waited seconds × QueueConfig::aging_per_second`, so an item that keeps waiting
///   eventually outranks any newcomer of fixed priority (no starvation by priority alone).
/// - **Fair share.** [`Queue::pass_fair`] walks the same way, but in the order of
///   [`crate::fair_share::FairShare`]: the best item of the account furthest below its share
///   next, each placement charging its account.
/// - **Placement.** Each item is placed with [`crate::place`] on the pass's own view of the
///   GPUs, which every placement (and every preemption) updates at once, so two items in one
///   pass never get the same memory.
/// - **Backfill (EASY).** The first item that cannot be placed becomes the head: from the known
///   end times of the running work (and of what this pass placed) its earliest start time `T`
///   (the shadow time) and the GPUs it would use then are computed, and that room is reserved.
///   A later item may then start only if it fits now and either ends by `T` or leaves, on every
///   GPU it uses, what the head needs at `T`. So backfill never delays the head. Work without a
///   known end never ends by `T`. A head that no known end time would let start (it waits on
///   open-ended work, or can never fit) reserves nothing, and the next item that cannot be
///   placed may become the head instead.
/// - **Preemption.** An item whose base priority is at least `QueueConfig::preempt_from`
///   (on-demand, reserved) that cannot fit asks [`crate::choose_victims`] for the running spot
///   instances (base priority below `preempt_from` and strictly below the item's, value = price
///   per hour) whose stopping lets it fit losing the least per hour. Only base priorities count:
///   aging reorders the queue but never lets waiting work preempt. Instances placed in the same
///   pass are never victims. Under a head reservation the placement made with the freed room
///   must still obey the backfill rule.
/// - **Quotas.** A guaranteed item (within its account's quota, whatever its tier) may also
///   preempt other accounts' borrowed work ([`Running::borrowed_of`]), seen at
///   [`crate::quota::BORROWED`] with no value, so that it goes before any spot work.
#[derive(Debug, Clone, Default)]
pub struct Queue {
    config: QueueConfig,
    items: Vec<Pending>,
}

impl Queue {
    pub fn new(config: QueueConfig) -> Self {
        Self {
            config,
            items: Vec::new(),
        }
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.items.iter()
    }

    pub fn push(&mut self, item: Pending) -> Result<(), QueueError> {
        if matches!(
            item.request,
            Request::Whole { count: 0 } | Request::Share { vram_mb: 0 }
        ) {
            return Err(QueueError::Empty { id: item.id });
        }
        if self.items.iter().any(|p| p.id == item.id) {
            return Err(QueueError::Duplicate { id: item.id });
        }
        self.items.push(item);
        Ok(())
    }

    pub fn remove(&mut self, id: u64) -> Option<Pending> {
        let at = self.items.iter().position(|p| p.id == id)?;
        Some(self.items.swap_remove(at))
    }

    /// One scheduling pass at `now` over `gpus` (free memory as it stands) and the `running`
    /// instances holding the rest. Placed items leave the queue.
    ///
    /// With `Q` queued items, `G` GPUs and `R` running instances a pass costs
    /// `O(Q log Q + Q × G log G + R × G log G)`: one best-fit placement per item (plus one more for
    /// the reason of an item left waiting) and one walk over the running work's end times for the
    /// head. A preemption attempt, made only for on-demand items that do not fit, costs what
    /// `choose_victims` costs over the nodes holding spot work.
    pub fn pass(&mut self, now: i64, gpus: &[GpuSlot], running: &[Running]) -> PassOutcome {
        self.pass_with(now, gpus, running, |_, _| true)
    }

    /// [`Queue::pass`] where `allowed(item, gpu)` says whether `item` may use `gpus[gpu]` (for
    /// instance the GPU model it asked for).
    pub fn pass_with(
        &mut self,
        now: i64,
        gpus: &[GpuSlot],
        running: &[Running],
        allowed: impl Fn(&Pending, usize) -> bool,
    ) -> PassOutcome {
        let config = self.config;
        let mut order: Vec<usize> = (0..self.items.len()).collect();
        order.sort_by_cached_key(|&i| config.walk_key(&self.items[i], now));
        self.walk_in(
            now,
            gpus,
            running,
            allowed,
            Visit::Priority(order.into_iter()),
        )
    }

    /// [`Queue::pass_with`] with fair share between accounts: the next item walked is the best
    /// (by [`QueueConfig::walk_key`]) of the account furthest below its share in `share`, and
    /// every placement charges its account at once (see [`FairShare`]). The walk itself
    /// (placement, backfill, preemption) is the same; only the order of the items changes. With
    /// one account this is exactly [`Queue::pass_with`].
    ///
    /// Costs what [`Queue::pass_with`] costs, plus `O(Q log Q)` for the order.
    pub fn pass_fair(
        &mut self,
        now: i64,
        gpus: &[GpuSlot],
        running: &[Running],
        share: &FairShare,
        allowed: impl Fn(&Pending, usize) -> bool,
    ) -> PassOutcome {
        let order = share.order(&self.items, &self.config, now);
        self.walk_in(now, gpus, running, allowed, Visit::Fair(share, order))
    }

    /// Walks the items in the order `visit` gives, and takes the placed ones out of the queue.
    fn walk_in(
        &mut self,
        now: i64,
        gpus: &[GpuSlot],
        running: &[Running],
        allowed: impl Fn(&Pending, usize) -> bool,
        mut visit: Visit<'_>,
    ) -> PassOutcome {
        let mut pass = Pass::new(self.config, now, gpus, running);
        let mut placed = vec![false; self.items.len()];
        while let Some(i) = visit.next() {
            let item = &self.items[i];
            let mask = |slots: &[GpuSlot]| -> Vec<GpuSlot> {
                slots
                    .iter()
                    .enumerate()
                    .map(|(g, s)| if allowed(item, g) { *s } else { unusable(s) })
                    .collect()
            };
            placed[i] = pass.walk(item, &mask(&pass.view), || mask(gpus));
            if placed[i] {
                if let (Visit::Fair(share, order), Some(p)) =
                    (&mut visit, pass.outcome.placed.last())
                {
                    let micro = placed_micro_gpus(gpus, &p.placement);
                    order.placed(share.charge(micro, item.duration_s));
                }
            }
        }
        let mut placed = placed.into_iter();
        self.items.retain(|_| !placed.next().unwrap_or(false));
        pass.outcome
    }
}

/// The order of a pass's walk: indices into the queue's items.
enum Visit<'a> {
    /// By [`QueueConfig::walk_key`], sorted up front.
    Priority(std::vec::IntoIter<usize>),
    /// Fair share: decided one item at a time, as placements charge the accounts.
    Fair(&'a FairShare, FairOrder),
}

impl Visit<'_> {
    fn next(&mut self) -> Option<usize> {
        match self {
            Visit::Priority(order) => order.next(),
            Visit::Fair(_, order) => order.next_item(),
        }
    }
}

/// A GPU an item may not use: `place` and `choose_victims` skip GPUs without memory, and the
/// index stays the same.
fn unusable(s: &GpuSlot) -> GpuSlot {
    GpuSlot {
        node: s.node,
        vram_mb: 0,
        free_mb: 0,
        switch: s.switch,
    }
}

/// The earliest time at or after `now` at which `request` could start on `gpus` if nothing but
/// the known end times of `running` changed them, and where: `None` when no known end time
/// makes room. Overdue instances (ending before `now`) count as ending at `now`.
/// `O(R log R + R × G log G)`.
pub fn earliest_start(
    now: i64,
    gpus: &[GpuSlot],
    running: &[Running],
    request: &Request,
) -> Option<(i64, Placement)> {
    if let Ok(p) = place(gpus, request) {
        return Some((now, p));
    }
    let mut ends: Vec<(i64, usize)> = running
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.ends_at.map(|e| (e.max(now), i)))
        .collect();
    ends.sort_unstable();
    let mut free = gpus.to_vec();
    let mut k = 0;
    while let Some(&(t, _)) = ends.get(k) {
        while let Some(&(_, i)) = ends.get(k).filter(|(e, _)| *e == t) {
            release(&mut free, &running[i].holds);
            k += 1;
        }
        if let Ok(p) = place(&free, request) {
            return Some((t, p));
        }
    }
    None
}

fn release(slots: &mut [GpuSlot], holds: &[(usize, u64)]) {
    for &(g, mb) in holds {
        if let Some(s) = slots.get_mut(g) {
            s.free_mb = s.free_mb.saturating_add(mb).min(s.vram_mb);
        }
    }
}

fn take(slots: &mut [GpuSlot], holds: &[(usize, u64)]) {
    for &(g, mb) in holds {
        if let Some(s) = slots.get_mut(g) {
            s.free_mb = s.free_mb.saturating_sub(mb);
        }
    }
}
