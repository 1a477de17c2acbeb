//! The control plane's background jobs, run by the maintenance loop rather than by a request:
//! the loop itself (`maintenance`), the scheduling pass over queued reservations (`scheduler`),
//! elastic capacity (`elastic`) and the alert webhook (`alerts`); beside it, on PostgreSQL, the
//! watch of other replicas' changes to the nodes' desired state (`versions`).
//! They fail with `JobError`, not the HTTP error: nobody is answered, the loop logs it and
//! tries again at the next tick.

pub(crate) mod alerts;
pub(crate) mod elastic;
pub(crate) mod maintenance;
pub(crate) mod scheduler;
pub(crate) mod versions;

use gpurent_store::StoreError;

/// Why a background job's pass failed; the maintenance loop logs it and tries again at the
/// next tick.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The store failed: the database out of reach, a transaction that lost a race, ...
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
}
