//! What this control plane knows of each endpoint between store reads: its settings, its
//! replicas and which of them are ready, the requests in flight on each and those waiting for
//! one, and its figures. The scaler fills it; the proxy takes replicas from it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use gpurent_store::{EndpointRow, ReplicaRow};
use tokio::sync::Notify;

use super::figures::Figures;

/// Every endpoint this control plane serves, by name, and the scaler's wake-up.
#[derive(Debug, Default)]
pub struct Endpoints {
    by_name: Mutex<HashMap<String, Arc<Live>>>,
    /// Woken when a request waits with no replica: the scaler acts at once.
    pub scaler: Notify,
    /// Replicas being drained before their stop (the sweep of removed endpoints' replicas
    /// leaves them to it).
    pub draining: Mutex<std::collections::HashSet<String>>,
}

/// One endpoint as this control plane sees it.
#[derive(Debug)]
pub struct Live {
    inner: Mutex<Inner>,
    /// Woken when a replica becomes ready or a request ends: waiting requests look again.
    pub changed: Notify,
}

/// A replica as the proxy sees it.
#[derive(Debug, Clone)]
pub struct Slot {
    pub index: u64,
    pub reservation_id: String,
    pub node: String,
    pub epoch: i64,
    pub generation: u64,
    /// Its reservation's status, and when it started running.
    pub status: gpurent_types::ReservationStatus,
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Its instance runs (its reservation is `running`).
    pub running: bool,
    /// It passed its health check, and has not failed one since.
    pub ready: bool,
    /// It was ready at some time.
    pub ever_ready: bool,
    /// It was ready and then failed its checks, or never became ready: the scaler stops it.
    pub unhealthy: bool,
    /// A health-check task watches it.
    pub watched: bool,
    /// The scaler stops it once its requests in flight are done: it takes no new one.
    pub draining: bool,
    /// Why its latest health check failed.
    pub last_error: Option<String>,
    /// Health checks failed in a row since it was ready.
    pub failed_checks: u32,
    /// When this control plane first saw it (a cold start is timed from there).
    pub seen: Instant,
    /// Started because requests waited with no replica ready.
    pub cold: bool,
    pub inflight: u32,
}

#[derive(Debug)]
pub struct Inner {
    pub row: EndpointRow,
    pub slots: Vec<Slot>,
    /// Requests waiting for a replica now.
    pub queued: u32,
    /// Since when the replicas exceed what the load asks for (the scaler's memory).
    pub below_since: Option<i64>,
    /// Gone from the store (deleted): waiting requests give up.
    pub deleted: bool,
    /// Until when this control plane holds the lease to scale it.
    pub lease_until: Option<Instant>,
    /// What this control plane last wrote of its load: (in flight, waiting, when).
    pub load_written: Option<(u32, u32, Instant)>,
    /// Failed replicas already counted against the endpoint.
    pub counted: std::collections::HashSet<String>,
    pub figures: Figures,
}

/// A replica that went away since the last read.
#[derive(Debug, Clone)]
pub struct Gone {
    pub endpoint_id: String,
    pub reservation_id: String,
    pub was_ready: bool,
    /// Its last failed health check, as this control plane saw it.
    pub last_error: Option<String>,
}

impl Endpoints {
    /// The endpoint named so, if this control plane has read it.
    pub fn get(&self, name: &str) -> Option<Arc<Live>> {
        lock(&self.by_name).get(name).cloned()
    }

    /// Keeps the live endpoints as the store has them now, with their replicas; forgets the
    /// others. Readiness, requests in flight and figures carry over. Returns the replicas that
    /// went away.
    pub fn refresh(&self, rows: Vec<EndpointRow>, replicas: &[ReplicaRow]) -> Vec<Gone> {
        let mut by_name = lock(&self.by_name);
        let mut next = HashMap::with_capacity(rows.len());
        let mut gone = Vec::new();
        for row in rows {
            let mine: Vec<&ReplicaRow> = replicas
                .iter()
                .filter(|r| r.endpoint_id == row.id && !r.reservation.status.is_terminal())
                .collect();
            let live = match by_name.remove(&row.name) {
                Some(live) if lock(&live.inner).row.id == row.id => live,
                _ => Arc::new(Live::new(row.clone())),
            };
            let (before, state_before) = {
                let inner = live.lock();
                (inner.row.revision, inner.row.state)
            };
            let changed = row.revision != before || row.state != state_before;
            let went = live.update(row, &mine);
            if changed || !went.is_empty() {
                live.changed.notify_waiters();
            }
            gone.extend(went);
            next.insert(live.name(), live);
        }
        // Those deleted: their waiting requests look again (and give up).
        for deleted in by_name.values() {
            deleted.lock().deleted = true;
            deleted.changed.notify_waiters();
        }
        *by_name = next;
        gone
    }

    /// Adds or replaces one endpoint at once (just created or changed by this control plane),
    /// before the scaler's next read.
    pub fn put(&self, row: EndpointRow) {
        let mut by_name = lock(&self.by_name);
        if let Some(live) = by_name.get(&row.name) {
            let mut inner = live.lock();
            if inner.row.id == row.id {
                inner.row = row;
                return;
            }
        }
        by_name.insert(row.name.clone(), Arc::new(Live::new(row)));
    }

    pub fn is_draining(&self, reservation_id: &str) -> bool {
        lock(&self.draining).contains(reservation_id)
    }

    pub fn all(&self) -> Vec<Arc<Live>> {
        lock(&self.by_name).values().cloned().collect()
    }
}

impl Live {
    fn new(row: EndpointRow) -> Live {
        Live {
            inner: Mutex::new(Inner {
                row,
                slots: Vec::new(),
                queued: 0,
                below_since: None,
                deleted: false,
                lease_until: None,
                load_written: None,
                counted: Default::default(),
                figures: Figures::default(),
            }),
            changed: Notify::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    pub fn name(&self) -> String {
        self.lock().row.name.clone()
    }

    /// Takes the store's view; returns the replicas that went away.
    fn update(&self, row: EndpointRow, replicas: &[&ReplicaRow]) -> Vec<Gone> {
        let mut inner = self.lock();
        inner.row = row;
        let now = Instant::now();
        let queued = inner.queued > 0;
        let mut slots: Vec<Slot> = Vec::with_capacity(replicas.len());
        for r in replicas {
            let res = &r.reservation;
            let old = inner
                .slots
                .iter()
                .find(|s| s.reservation_id == res.id)
                .cloned();
            let running = res.status == gpurent_types::ReservationStatus::Running;
            let slot = match old {
                Some(mut s) => {
                    s.node = res.node.clone().unwrap_or_default();
                    s.epoch = res.epoch;
                    s.running = running;
                    s.status = res.status;
                    s.started_at = res.started_at;
                    s.ready &= running;
                    s
                }
                None => Slot {
                    index: r.index,
                    reservation_id: res.id.clone(),
                    node: res.node.clone().unwrap_or_default(),
                    epoch: res.epoch,
                    generation: r.generation,
                    status: res.status,
                    started_at: res.started_at,
                    running,
                    ready: false,
                    ever_ready: false,
                    unhealthy: false,
                    watched: false,
                    draining: false,
                    last_error: None,
                    failed_checks: 0,
                    seen: now,
                    cold: queued && !inner.slots.iter().any(|s| s.ready),
                    inflight: 0,
                },
            };
            slots.push(slot);
        }
        let gone = inner
            .slots
            .iter()
            .filter(|old| !slots.iter().any(|s| s.reservation_id == old.reservation_id))
            .map(|old| Gone {
                endpoint_id: inner.row.id.clone(),
                reservation_id: old.reservation_id.clone(),
                was_ready: old.ever_ready,
                last_error: old.last_error.clone(),
            })
            .collect();
        inner.slots = slots;
        gone
    }

    /// Marks a replica ready (its health check passed): true the first time.
    pub fn set_ready(&self, reservation_id: &str, ready: bool) -> bool {
        let mut inner = self.lock();
        let now = Instant::now();
        let Some(slot) = inner
            .slots
            .iter_mut()
            .find(|s| s.reservation_id == reservation_id)
        else {
            return false;
        };
        let first = ready && !slot.ready;
        let lost = !ready && slot.ready;
        slot.ready = ready;
        slot.ever_ready |= ready;
        slot.unhealthy |= lost;
        slot.failed_checks = 0;
        if ready {
            slot.last_error = None;
        }
        let (cold, seen) = (slot.cold, slot.seen);
        if first && cold {
            slot.cold = false;
            inner.figures.cold_start(now - seen);
        }
        if first || lost {
            let ready_count = inner.slots.iter().filter(|s| s.ready).count();
            inner.figures.replicas(ready_count);
        }
        drop(inner);
        if first {
            self.changed.notify_waiters();
        }
        first
    }
}

impl Live {
    /// A ready replica failed a check: how many in a row now.
    pub fn failed_check(&self, reservation_id: &str, why: &str) -> u32 {
        let mut inner = self.lock();
        inner
            .slots
            .iter_mut()
            .find(|s| s.reservation_id == reservation_id)
            .map_or(0, |s| {
                s.failed_checks += 1;
                s.last_error = Some(why.to_owned());
                s.failed_checks
            })
    }

    /// A starting replica's check failed (it may not listen yet): kept to say why, should it
    /// never become ready.
    pub fn note_start_failure(&self, reservation_id: &str, why: String) {
        if let Some(s) = self
            .lock()
            .slots
            .iter_mut()
            .find(|s| s.reservation_id == reservation_id)
        {
            s.last_error = Some(why);
        }
    }
}

impl Inner {
    /// The ready replica with the fewest requests in flight, under `cap` each; it counts one
    /// more. `avoid`: a replica that just failed this request.
    pub fn take(&mut self, cap: u32, avoid: Option<&str>) -> Option<Slot> {
        let slot = self
            .slots
            .iter_mut()
            .filter(|s| {
                s.ready
                    && !s.draining
                    && s.inflight < cap
                    && Some(s.reservation_id.as_str()) != avoid
            })
            .min_by_key(|s| (s.inflight, s.index))?;
        slot.inflight += 1;
        Some(slot.clone())
    }

    /// A request on `reservation_id` ended.
    pub fn give_back(&mut self, reservation_id: &str) {
        if let Some(slot) = self
            .slots
            .iter_mut()
            .find(|s| s.reservation_id == reservation_id)
        {
            slot.inflight = slot.inflight.saturating_sub(1);
        }
    }

    pub fn inflight(&self) -> u32 {
        self.slots.iter().map(|s| s.inflight).sum()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
