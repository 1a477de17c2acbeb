//! Reservations that arrive together are written together: each request waits in a queue and
//! one writer at a time, on a thread of its own (`writer_thread`), takes every request waiting
//! and places them in one transaction (`batched`), so the write lock, the round trips and the
//! commit are paid once a batch, not once a reservation. Under no load a batch is one
//! reservation, written at once.

use std::sync::{Mutex, MutexGuard, OnceLock};

use chrono::{DateTime, Utc};
use gpurent_billing::PriceList;
use gpurent_sched::Request;
use tokio::sync::oneshot;

use super::batched::{Batched, Job};
use super::held::Held;
use super::writer_thread::WriterThread;
use super::SqlStore;
use crate::{NewReservation, RecordWithin, Reserved, Result, StoreError};

/// The most reservations written in one batch.
const MOST: usize = 64;

/// The requests waiting for the writer, and whether a writer runs.
#[derive(Default)]
pub(super) struct Combiner {
    pending: Mutex<Pending>,
    /// On PostgreSQL, the connection the writer keeps between batches (`held`).
    pub(super) held: Held,
    /// The thread the writer runs on (`writer_thread`), started with the first reservation.
    thread: OnceLock<Option<WriterThread>>,
}

/// One writer at a time, for each replica. On PostgreSQL a second one would read and plan while
/// the first waits for its round trips, but measured it halved the batches and lost more than it
/// overlapped (`bench reserve`, 2026-12-02: 407-505/s with two, 467-599/s with one); other
/// replicas' writers run beside this one (their candidates are read `FOR UPDATE SKIP LOCKED`).
#[derive(Default)]
struct Pending {
    jobs: Vec<(Job, oneshot::Sender<Batched>)>,
    /// A writer task runs.
    writing: bool,
}

impl std::fmt::Debug for Combiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner").finish_non_exhaustive()
    }
}

impl Combiner {
    /// Closes the writer's connection (the store is closing).
    pub(super) async fn release(&self) {
        self.held.release().await;
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Nothing panics while the lock is held; a poisoned one holds consistent data.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer's mark: when its task ends early (a panic), the requests still waiting are
/// dropped, so that their callers place them alone, and the next request starts a writer.
struct Writing<'a> {
    combiner: &'a Combiner,
    /// Ended normally: `writing` was cleared with the last batch taken.
    done: bool,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut pending = self.combiner.lock();
        pending.writing = false;
        pending.jobs.clear();
    }
}

impl SqlStore {
    /// `reserve`, written in a batch with the requests that arrive meanwhile (with `record`,
    /// the request's audit record, where the batch places it); what the batch does not decide
    /// alone (or every request, if its writer went away before answering) is placed by the
    /// one-reservation path, which records nothing.
    pub(super) async fn reserve_combined(
        &self,
        new: NewReservation,
        prices: &PriceList,
        live_since: i64,
        now: DateTime<Utc>,
        expected: &[Request],
        record: Option<RecordWithin>,
    ) -> Result<Reserved> {
        // Volumes are claimed under their rows' locks, which a batch does not take, and a
        // team's reservation is counted against its maker's caps too (under their row's lock,
        // after the team's), and an endpoint's replica is rare and an array's task comes from
        // its pass one at a time: such a reservation is placed alone.
        if !new.mounts.is_empty()
            || new.created_by.is_some()
            || new.replica_of.is_some()
            || new.array_of.is_some()
        {
            let (reservation, nodes) = self
                .reserve_planned(&new, prices, live_since, now, expected)
                .await?;
            return Ok(Reserved {
                reservation,
                nodes,
                recorded: false,
            });
        }
        let (reply, answer) = oneshot::channel();
        let job = Job {
            new: new.clone(),
            prices: prices.clone(),
            live_since,
            now,
            expected: expected.to_vec(),
            record,
        };
        let start = {
            let mut pending = self.combiner.lock();
            pending.jobs.push((job, reply));
            !std::mem::replace(&mut pending.writing, true)
        };
        if start {
            // A task of its own: a caller that goes away (its client hung up) does not take a
            // batch of others' reservations, half written, with it.
            let store = self.clone();
            match self.combiner.thread.get_or_init(WriterThread::start) {
                Some(thread) => thread.run(store),
                None => {
                    tokio::spawn(store.write_combined());
                }
            }
        }
        match answer.await {
            Ok(Batched::Placed {
                reservation,
                nodes,
                recorded,
            }) => Ok(Reserved {
                reservation: *reservation,
                nodes,
                recorded,
            }),
            Ok(Batched::Unknown(why)) => Err(StoreError::Unavailable(why)),
            Ok(Batched::Alone) | Err(_) => {
                let (reservation, nodes) = self
                    .reserve_planned(&new, prices, live_since, now, expected)
                    .await?;
                Ok(Reserved {
                    reservation,
                    nodes,
                    recorded: false,
                })
            }
        }
    }

    /// Writes batches until no request waits.
    pub(super) async fn write_combined(self) {
        let mut mark = Writing {
            combiner: &self.combiner,
            done: false,
        };
        loop {
            let (jobs, replies): (Vec<Job>, Vec<oneshot::Sender<Batched>>) = {
                let mut pending = self.combiner.lock();
                if pending.jobs.is_empty() {
                    pending.writing = false;
                    mark.done = true;
                    break;
                }
                let n = pending.jobs.len().min(MOST);
                pending.jobs.drain(..n).unzip()
            };
            let outcomes = self.reserve_batch(&jobs).await;
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A caller gone meanwhile: its reservation stands, as a request whose answer
                // was lost (a retry with its Idempotency-Key finds it).
                let _ = reply.send(outcome);
            }
        }
    }
}
