//! The independent models the billing test compares the store with: a reservation's charge
//! over the seconds it ran, and a volume's over its stretches.

use gpurent_billing::{storage_charge, PriceList, Rate, BYTES_PER_GB};
use gpurent_types::{Money, Tier};

/// The model of one volume: its stretches (from, GB) and when it was removed.
#[derive(Debug, Clone)]
pub(super) struct VolumeModel {
    pub(super) id: String,
    pub(super) local: bool,
    pub(super) stretches: Vec<(i64, u64)>,
    pub(super) removed: Option<i64>,
}

impl VolumeModel {
    /// What it was charged by `end` (its removal, else `end`): each stretch's size for its
    /// seconds, rounded down once per stretch.
    pub(super) fn charge(&self, end: i64) -> Money {
        let end = self.removed.unwrap_or(end);
        let mut total = Money::ZERO;
        for (i, (from, gb)) in self.stretches.iter().enumerate() {
            let to = self.stretches.get(i + 1).map_or(end, |(next, _)| *next);
            let seconds = u64::try_from(to - from).unwrap_or(0);
            total = total
                .checked_add(storage_charge(
                    PriceList::defaults().storage_per_gb_month,
                    gb * BYTES_PER_GB,
                    seconds,
                ))
                .unwrap();
        }
        total
    }
}

/// The model of one reservation, in whole seconds since t0.
#[derive(Debug, Clone)]
pub(super) struct Model {
    pub(super) id: String,
    pub(super) tier: Tier,
    pub(super) rate: Rate,
    pub(super) duration: i64,
    pub(super) start: Option<i64>,
    pub(super) stop_at: Option<i64>,
    pub(super) end: Option<i64>,
    /// Ended by the platform (its agent stopped it unasked, its node was lost): a block's
    /// unused part goes back.
    pub(super) platform_ended: bool,
    pub(super) stop_on_loss: bool,
    /// Waiting to run again after its node was lost or drained (the test places nothing
    /// again): it ends queued, charged for the seconds it ran before only.
    pub(super) queued: bool,
    pub(super) run_before: i64,
    /// A managed job (`restart: on-failure`, `max_restarts: 1`), and its counted restarts.
    pub(super) managed: bool,
    pub(super) counted: u32,
    /// Times it went back to the queue (its restarts, as `get` lists them).
    pub(super) requeued: usize,
    /// Why its stop was asked for, as a restart policy tells them apart.
    pub(super) stop_why: Option<Why>,
}

/// What asked for a reservation's stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    Tenant,
    Vram,
    Idle,
    Expired,
    Preempted,
}

impl Model {
    pub(super) fn charge(&self) -> Money {
        let seconds = match (self.start, self.end) {
            _ if self.queued => self.run_before,
            _ if self.tier == Tier::Reserved && self.end.is_some() && !self.platform_ended => {
                self.duration
            }
            (Some(s), Some(e)) => (e - s).max(0),
            _ => 0,
        };
        self.rate
            .charge_for_seconds(u64::try_from(seconds).unwrap_or(0))
    }

    /// A stop is asked for: billing ends now, or at the end of its hours if those are up.
    pub(super) fn stop(&mut self, now: i64, why: Why) {
        // Its tenant's stop during a preemption's notice is why it ends.
        if self.stop_why == Some(Why::Preempted) && why == Why::Tenant {
            self.stop_why = Some(why);
        }
        if self.end.is_some() || self.stop_at.is_some() {
            return;
        }
        self.stop_why = Some(why);
        // A queued reservation has nothing to stop: it ends at once.
        if self.queued {
            self.end = Some(now);
            return;
        }
        self.stop_at = Some(match self.start {
            Some(s) if now >= s + self.duration => s + self.duration,
            _ => now,
        });
    }

    /// The agent says the instance is gone (stopped, exited or failed): it ends.
    pub(super) fn gone(&mut self, now: i64) {
        if self.end.is_some() {
            return;
        }
        let mut end = self.stop_at.map_or(now, |t| t.min(now));
        if let Some(s) = self.start {
            end = end.min(s + self.duration);
        }
        self.end = Some(end);
    }

    /// Placed and live, with no stop asked: what a drain or a lost node moves.
    pub(super) fn movable(&self) -> bool {
        !self.queued && self.end.is_none() && self.stop_at.is_none()
    }

    /// Running, as the store sees it (neither stopping nor queued).
    pub(super) fn running(&self) -> bool {
        self.movable() && self.start.is_some()
    }

    /// Its run is billed to `at` and it waits in the queue again.
    pub(super) fn requeue(&mut self, at: i64) {
        if let Some(s) = self.start.take() {
            self.run_before = (at - s).clamp(0, self.duration);
        }
        self.queued = true;
        self.stop_at = None;
        self.stop_why = None;
        self.requeued += 1;
    }

    /// Its run ended at `now` (`failed`: its command's exit was non-zero, or it could not
    /// start; `Some(false)`: it exited 0; `None`: stopped, or its node fenced): true when it is
    /// a managed job queued again for it: interrupted (preempted, stopped unasked) always,
    /// failed (over its GPU memory too) once; billed to its stop, if one was asked for.
    pub(super) fn restarts(&mut self, now: i64, failed: Option<bool>) -> bool {
        if !self.managed || self.queued || self.end.is_some() {
            return false;
        }
        let at = self.stop_at.map_or(now, |t| t.min(now));
        if self.start.is_some_and(|s| s + self.duration <= at) {
            return false;
        }
        let counted = match (self.stop_why, failed) {
            (Some(Why::Preempted), _) | (None, None) => false,
            (Some(Why::Vram), _) | (None, Some(true)) => true,
            (Some(_), _) | (None, Some(false)) => return false,
        };
        if counted {
            if self.counted >= 1 {
                return false;
            }
            self.counted += 1;
        }
        self.requeue(at);
        true
    }

    /// Its node was lost at `fence_at`: what was stopping ends, what ran out its hours
    /// expired, what chose to end ends as lost, the rest is queued again.
    pub(super) fn fence(&mut self, fence_at: i64) {
        if self.queued || self.end.is_some() {
            return;
        }
        if self.stop_at.is_some() {
            if !self.restarts(fence_at, None) {
                self.gone(fence_at);
            }
        } else if let Some(deadline) = self.start.map(|s| s + self.duration) {
            if deadline <= fence_at {
                self.stop_at = Some(deadline);
                self.gone(fence_at);
                return;
            }
            self.lose(fence_at);
        } else {
            self.lose(fence_at);
        }
    }

    pub(super) fn lose(&mut self, fence_at: i64) {
        if self.stop_on_loss {
            self.platform_ended = true;
            self.gone(fence_at);
        } else {
            self.requeue(fence_at);
        }
    }

    /// An end the agent reported without being asked, before the hours were up.
    pub(super) fn unasked(&self, now: i64) -> bool {
        self.stop_at.is_none() && self.start.is_none_or(|s| now < s + self.duration)
    }
}
