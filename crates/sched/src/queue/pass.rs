//! One pass of the queue in progress: the walk of one item (placement, EASY backfill behind the
//! head's reservation, preemption), whatever the order the items come in.

use super::{
    earliest_start, release, take, Head, PassOutcome, Pending, Placed, QueueConfig, Reason, Running,
};
use crate::quota::BORROWED;
use crate::{choose_victims, place, GpuSlot, Placement, Victim};

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
pub(super) struct Pass {
    config: QueueConfig,
    now: i64,
    /// Free memory now, after this pass's placements and preemptions.
    pub(super) view: Vec<GpuSlot>,
    live: Vec<Live>,
    reservation: Option<Reservation>,
    pub(super) outcome: PassOutcome,
}

impl Pass {
    pub(super) fn new(
        config: QueueConfig,
        now: i64,
        gpus: &[GpuSlot],
        running: &[Running],
    ) -> Self {
        Pass {
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
        }
    }

    /// Places `item` or records why not; `masked` is the view with the GPUs it may not use
    /// made unusable, `fresh` the same of the GPUs before the pass. True when placed.
    pub(super) fn walk(
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
        if (self.config.may_preempt_spot(item) || item.guaranteed)
            && self.preempt(item, masked, &usable, ends_at)
        {
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
                !l.fresh && self.config.may_take(item, &l.run)
            })
            .collect();
        if candidates.is_empty() {
            return false;
        }
        let victims: Vec<Victim> = candidates
            .iter()
            .map(|&i| {
                let r = &self.live[i].run;
                // Borrowed work taken back goes first, whatever it pays.
                let reclaimed = item.guaranteed && r.borrowed_of.is_some_and(|a| a != item.account);
                Victim {
                    priority: if reclaimed { BORROWED } else { r.priority },
                    value: if reclaimed { 0 } else { r.value },
                    started_at: r.started_at,
                    holds: r.holds.clone(),
                }
            })
            .collect();
        // Borrowed work is seen below any bid: a guaranteed spot item may take it back too.
        let Some(chosen) = choose_victims(
            usable,
            &victims,
            &item.request,
            item.priority.max(BORROWED + 1),
        ) else {
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
                borrowed_of: None,
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
