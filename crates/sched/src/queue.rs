//! The live scheduler's queue: priorities with aging, EASY backfill and spot preemption.

use std::cmp::Reverse;

pub use crate::plan::{ON_DEMAND, RESERVED};
use crate::{choose_victims, place, GpuSlot, NoFit, Placement, Request, Victim};

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

    fn may_preempt(&self, item: &Pending) -> bool {
        item.priority >= self.preempt_from || self.spot_preempts_lower_bids
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
#[derive(Debug, Clone, Default)]
pub struct Queue {
    config: QueueConfig,
    items: Vec<Pending>,
}

/// The room reserved for the head while later items are walked.
#[derive(Debug)]
struct Reservation {
    head: u64,
    until: i64,
    /// Per GPU: MiB that work still running at `until` may hold there without taking what the
    /// head needs then.
    slack: Vec<u64>,
}

/// A running instance in the pass's view.
#[derive(Debug)]
struct Live {
    run: Running,
    /// Placed by this pass: not a victim for later items.
    fresh: bool,
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
        order.sort_by_cached_key(|&i| {
            let p = &self.items[i];
            (
                Reverse(config.effective_priority(p, now)),
                p.enqueued_at,
                p.id,
            )
        });
        let mut pass = Pass {
            config,
            now,
            view: gpus.to_vec(),
            live: running
                .iter()
                .map(|r| Live {
                    run: r.clone(),
                    fresh: false,
                })
                .collect(),
            reservation: None,
            outcome: PassOutcome::default(),
        };
        let mut placed = vec![false; self.items.len()];
        for i in order {
            let item = &self.items[i];
            let mask = |slots: &[GpuSlot]| -> Vec<GpuSlot> {
                slots
                    .iter()
                    .enumerate()
                    .map(|(g, s)| if allowed(item, g) { *s } else { unusable(s) })
                    .collect()
            };
            placed[i] = pass.walk(item, &mask(&pass.view), || mask(gpus));
        }
        let mut placed = placed.into_iter();
        self.items.retain(|_| !placed.next().unwrap_or(false));
        pass.outcome
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

/// What an item may use while a reservation stands: no more of each GPU than its slack.
fn within_slack(slots: &[GpuSlot], slack: &[u64]) -> Vec<GpuSlot> {
    slots
        .iter()
        .zip(slack)
        .map(|(s, &room)| GpuSlot {
            free_mb: s.free_mb.min(room),
            ..*s
        })
        .collect()
}

/// One pass in progress: its view of the GPUs and the running work, and what it decided.
#[derive(Debug)]
struct Pass {
    config: QueueConfig,
    now: i64,
    /// Free memory now, after this pass's placements and preemptions.
    view: Vec<GpuSlot>,
    live: Vec<Live>,
    reservation: Option<Reservation>,
    outcome: PassOutcome,
}

impl Pass {
    /// Places `item` or records why not; `masked` is the view with the GPUs it may not use
    /// made unusable, `fresh` the same of the GPUs before the pass. True when placed.
    fn walk(
        &mut self,
        item: &Pending,
        masked: &[GpuSlot],
        fresh: impl FnOnce() -> Vec<GpuSlot>,
    ) -> bool {
        let ends_at = item.duration_s.map(|d| {
            self.now
                .saturating_add(i64::try_from(d).unwrap_or(i64::MAX))
        });
        // Work that is gone by the head's start cannot delay it; other work must keep within
        // the slack.
        let bounded = self
            .reservation
            .as_ref()
            .filter(|r| ends_at.is_none_or(|e| e > r.until));
        let usable = match bounded {
            Some(r) => within_slack(masked, &r.slack),
            None => masked.to_vec(),
        };
        if let Ok(p) = place(&usable, &item.request) {
            self.commit(item, ends_at, p, Vec::new(), None);
            return true;
        }
        if self.config.may_preempt(item) && self.preempt(item, masked, &usable, ends_at) {
            return true;
        }
        let reason = match &self.reservation {
            Some(r) if place(masked, &item.request).is_ok() => Reason::ReservedForHead {
                head: r.head,
                until: r.until,
            },
            _ => match place(&fresh(), &item.request) {
                Err(no_fit) => Reason::NoFit(no_fit),
                Ok(_) => Reason::BehindHigherPriority,
            },
        };
        if self.reservation.is_none() {
            self.reserve(item, masked);
        }
        self.outcome.waiting.push((item.id, reason));
        false
    }

    /// Frees room for `item` by stopping spot instances, if that lets it fit (and, under a
    /// reservation, still keep to the backfill rule).
    fn preempt(
        &mut self,
        item: &Pending,
        masked: &[GpuSlot],
        usable: &[GpuSlot],
        ends_at: Option<i64>,
    ) -> bool {
        let candidates: Vec<usize> = (0..self.live.len())
            .filter(|&i| {
                let l = &self.live[i];
                !l.fresh && self.config.is_spot(l.run.priority) && l.run.priority < item.priority
            })
            .collect();
        if candidates.is_empty() {
            return false;
        }
        let victims: Vec<Victim> = candidates
            .iter()
            .map(|&i| {
                let r = &self.live[i].run;
                Victim {
                    priority: r.priority,
                    value: r.value,
                    started_at: r.started_at,
                    holds: r.holds.clone(),
                }
            })
            .collect();
        let Some(chosen) = choose_victims(usable, &victims, &item.request, item.priority) else {
            return false;
        };
        let chosen: Vec<usize> = chosen.into_iter().map(|v| candidates[v]).collect();
        // Check the placement on the view with the victims gone: the victims may also have
        // held room the reservation counted on, or room the item may not use.
        let mut after = masked.to_vec();
        for &v in &chosen {
            release(&mut after, &self.live[v].run.holds);
        }
        let bounded = self
            .reservation
            .as_ref()
            .filter(|r| ends_at.is_none_or(|e| e > r.until));
        let slack = bounded.map(|r| {
            let mut slack = r.slack.clone();
            for &v in &chosen {
                let run = &self.live[v].run;
                // Work ending by the head's start was already counted as gone then.
                if run.ends_at.is_none_or(|e| e.max(self.now) > r.until) {
                    for &(g, mb) in &run.holds {
                        if let Some(s) = slack.get_mut(g) {
                            *s = s.saturating_add(mb);
                        }
                    }
                }
            }
            slack
        });
        let fits = match &slack {
            Some(slack) => place(&within_slack(&after, slack), &item.request),
            None => place(&after, &item.request),
        };
        let Ok(p) = fits else {
            return false;
        };
        self.commit(item, ends_at, p, chosen, slack);
        true
    }

    /// Records `item` as placed at `p` after stopping the `victims` (indices into `live`).
    fn commit(
        &mut self,
        item: &Pending,
        ends_at: Option<i64>,
        p: Placement,
        mut victims: Vec<usize>,
        slack: Option<Vec<u64>>,
    ) {
        victims.sort_unstable_by(|a, b| b.cmp(a));
        let mut preempts = Vec::with_capacity(victims.len());
        for v in victims {
            let gone = self.live.swap_remove(v).run;
            release(&mut self.view, &gone.holds);
            preempts.push(gone.id);
        }
        preempts.reverse();
        take(&mut self.view, &p.gpus);
        let backfilled = self.reservation.is_some();
        if let Some(r) = &mut self.reservation {
            if let Some(slack) = slack {
                r.slack = slack;
            }
            if ends_at.is_none_or(|e| e > r.until) {
                take_slack(&mut r.slack, &p.gpus);
            }
        }
        self.live.push(Live {
            run: Running {
                id: item.id,
                priority: item.priority,
                value: 0,
                started_at: self.now,
                ends_at,
                holds: p.gpus.clone(),
            },
            fresh: true,
        });
        self.outcome.preempted.extend(preempts.iter().copied());
        self.outcome.placed.push(Placed {
            item: item.clone(),
            placement: p,
            preempts,
            backfilled,
        });
    }

    /// Makes `item`, the first that could not be placed, the head: reserves what it needs at
    /// its earliest start, if the running work's end times give one.
    fn reserve(&mut self, item: &Pending, masked: &[GpuSlot]) {
        let running: Vec<Running> = self.live.iter().map(|l| l.run.clone()).collect();
        let Some((until, plan)) = earliest_start(self.now, masked, &running, &item.request) else {
            return;
        };
        let mut at_start = self.view.clone();
        for r in &running {
            if r.ends_at.is_some_and(|e| e.max(self.now) <= until) {
                release(&mut at_start, &r.holds);
            }
        }
        let mut slack: Vec<u64> = at_start.iter().map(|s| s.free_mb).collect();
        take_slack(&mut slack, &plan.gpus);
        self.outcome.head = Some(Head {
            id: item.id,
            start_at: until,
            gpus: plan.gpus,
        });
        self.reservation = Some(Reservation {
            head: item.id,
            until,
            slack,
        });
    }
}

fn take_slack(slack: &mut [u64], holds: &[(usize, u64)]) {
    for &(g, mb) in holds {
        if let Some(s) = slack.get_mut(g) {
            *s = s.saturating_sub(mb);
        }
    }
}
