//! The output a sync ships: new bytes of every instance the control plane wants, within what
//! it keeps, and the output the executor kept of stopped instances until it is shipped.

use std::collections::{BTreeMap, BTreeSet};

use gpurent_types::agent::{Assignment, LogChunk, LOG_TAIL_BYTES};

use super::Agent;
use crate::reconcile::{Observed, ObservedState};

/// Output shipped with one sync, for one running instance and for all (an instance that
/// ended may take all of it: its end waits for its output).
const LOG_BYTES_PER_INSTANCE: usize = 256 * 1024;
const LOG_BYTES_PER_SYNC: usize = 1024 * 1024;

/// The output one sync ships.
pub(super) struct NewOutput {
    pub(super) chunks: Vec<LogChunk>,
    /// Instances that ended (or were stopped) whose output is not all shipped with these
    /// chunks.
    pub(super) unshipped: BTreeSet<String>,
}

impl Agent {
    /// The outputs the executor kept of stopped instances, as (reservation, epoch).
    pub(super) async fn kept_outputs(&self) -> Vec<(String, i64)> {
        self.executor.kept_outputs().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list the output kept of stopped instances");
            Vec::new()
        })
    }

    /// Once a sync is answered: the output kept of a stop it reported is shipped, and that of
    /// an instance the control plane no longer wants stopped (gone, another epoch, wanted
    /// running: a stop of the agent's own, or one before it restarted) will never be asked for.
    pub(super) async fn forget_outputs(
        &self,
        kept: &[(String, i64)],
        reported: &[(String, i64)],
        desired: &[Assignment],
    ) {
        for (id, epoch) in kept {
            let wanted = desired
                .iter()
                .any(|a| &a.reservation_id == id && a.epoch == *epoch && !a.run);
            if wanted && !reported.contains(&(id.clone(), *epoch)) {
                continue;
            }
            if let Err(e) = self.executor.forget_output(id, *epoch).await {
                tracing::warn!(reservation_id = %id, error = %e, "cannot remove the output kept of a stopped instance");
            }
        }
    }

    /// Output the control plane does not have yet, for every instance of the epoch it wants
    /// (a stale epoch's output is not the current run's), as its bytes; for an instance it
    /// stopped and the executor removed, the output the executor kept. Within what the
    /// control plane keeps (`log_room`); past that, nothing until the instance ended, then
    /// the end of its output (the last `LOG_TAIL_BYTES`).
    pub(super) async fn new_output(
        &self,
        desired: &[Assignment],
        actual: &[Observed],
        kept: &[(String, i64)],
        log_room: &BTreeMap<String, u64>,
    ) -> NewOutput {
        let mut chunks = Vec::new();
        let mut unshipped = BTreeSet::new();
        let mut budget = LOG_BYTES_PER_SYNC;
        for a in desired {
            let id = &a.reservation_id;
            let observed = actual
                .iter()
                .find(|o| &o.reservation_id == id && o.epoch == a.epoch);
            let ended = match observed {
                Some(o) => matches!(o.state, ObservedState::Exited(_)),
                None if !a.run && kept.contains(&(id.clone(), a.epoch)) => true,
                None => continue,
            };
            if budget == 0 {
                if ended {
                    unshipped.insert(id.clone());
                }
                continue;
            }
            let mut max = budget.min(if ended {
                LOG_BYTES_PER_SYNC
            } else {
                LOG_BYTES_PER_INSTANCE
            });
            let mut from = a.log_offset;
            match log_room.get(id) {
                Some(0) if !ended => continue,
                Some(0) => match self.executor.output_size(id).await {
                    Ok(Some(size)) => from = from.max(size.saturating_sub(LOG_TAIL_BYTES)),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(reservation_id = %id, error = %e, "cannot size output")
                    }
                },
                Some(&room) => max = max.min(usize::try_from(room).unwrap_or(usize::MAX)),
                None => {}
            }
            let bytes = match self.executor.read_output(id, from, max).await {
                Ok(Some(bytes)) if !bytes.is_empty() => bytes,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(reservation_id = %id, error = %e, "cannot read output");
                    continue;
                }
            };
            // A full read may have left more behind.
            if ended && bytes.len() >= max {
                unshipped.insert(id.clone());
            }
            budget = budget.saturating_sub(bytes.len());
            chunks.push(LogChunk::of_bytes(id, a.epoch, from, &bytes));
        }
        NewOutput { chunks, unshipped }
    }
}
