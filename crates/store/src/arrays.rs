//! Job arrays: the store's side of `--array` (`ArrayStore`, implemented in `sql/arrays.rs`):
//! the arrays, the index each starts next, and their tasks (reservations) counted.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::Reservation;
use gpurent_types::Money;

use crate::{Result, Scope};

/// An array to keep, checked by the control plane.
#[derive(Debug, Clone)]
pub struct NewArray {
    pub tenant_id: String,
    /// The member who made it, where it is a team's.
    pub created_by: Option<String>,
    /// Its tasks' shape: the request (JSON), without its secrets' values.
    pub spec: String,
    /// The tasks' secret variables, sealed.
    pub sealed_secrets: Option<String>,
    pub idempotency_key: Option<String>,
    /// What a retry with the same key must ask again.
    pub request_hash: String,
    pub first: u64,
    pub last: u64,
    pub max_running: Option<u32>,
}

/// An array as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayRow {
    pub id: String,
    pub tenant_id: String,
    pub created_by: Option<String>,
    pub spec: String,
    pub sealed_secrets: Option<String>,
    pub first: u64,
    pub last: u64,
    pub max_running: Option<u32>,
    /// The next index to start (past `last`: all started).
    pub next_index: u64,
    /// Why its next task cannot start, until `retry_at`.
    pub message: Option<String>,
    pub retry_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// Stopped: no task starts after.
    pub stopped_at: Option<DateTime<Utc>>,
    /// Every task started has ended, and none is left to start.
    pub ended_at: Option<DateTime<Utc>>,
}

/// An array's started tasks, counted by where each is, with their charges together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArrayTasks {
    /// Exited 0.
    pub done: u64,
    /// Failed, preempted or lost.
    pub failed: u64,
    /// Stopped otherwise (its tenant, credit, its hours).
    pub stopped: u64,
    /// On a node.
    pub running: u64,
    /// In the queue.
    pub queued: u64,
    pub charged: Money,
    pub held: Money,
    pub first_started: Option<DateTime<Utc>>,
    pub last_ended: Option<DateTime<Utc>>,
}

#[async_trait]
pub trait ArrayStore: Send + Sync {
    /// Keeps a new array; a retry with the same Idempotency-Key returns the first, or
    /// `IdempotencyMismatch` when it asks something else.
    async fn create_array(&self, new: NewArray, now: DateTime<Utc>) -> Result<ArrayRow>;

    /// The array in the caller's scope (`NotFound` otherwise).
    async fn get_array(&self, id: &str, scope: &Scope) -> Result<ArrayRow>;

    /// The caller's arrays, newest first, at most `limit`.
    async fn list_arrays(&self, scope: &Scope, limit: u32) -> Result<Vec<ArrayRow>>;

    /// Every array not ended yet, oldest first.
    async fn live_arrays(&self) -> Result<Vec<ArrayRow>>;

    /// How many live tasks (queued or running) each of the arrays `ids` has; absent: none.
    async fn array_live_tasks(&self, ids: &[String]) -> Result<Vec<(String, u64)>>;

    /// Each array's started tasks, counted (absent: none started).
    async fn array_tasks(&self, ids: &[String]) -> Result<Vec<(String, ArrayTasks)>>;

    /// Moves the array's next index on to `to`, never back: every index below it was started
    /// (each pass starts the indexes from the one it read, each under its own key, so a pass
    /// behind another starts nothing twice). False when it was there already.
    async fn advance_array(&self, id: &str, to: u64) -> Result<bool>;

    /// Why the array's next task cannot start, and when it is tried again (`None`: it can).
    async fn set_array_message(
        &self,
        id: &str,
        message: Option<&str>,
        retry_at: Option<DateTime<Utc>>,
    ) -> Result<()>;

    /// Stops the array (no task starts after; stopping its live tasks is the caller's), in
    /// the caller's scope; a second stop changes nothing.
    async fn stop_array(&self, id: &str, scope: &Scope, now: DateTime<Utc>) -> Result<ArrayRow>;

    /// Removes an array none of whose tasks started (its first was refused), so that a retry
    /// of its request (the same Idempotency-Key) makes it anew.
    async fn forget_array(&self, id: &str) -> Result<()>;

    /// Marks the array ended: nothing left to start and no task live.
    async fn end_array(&self, id: &str, now: DateTime<Utc>) -> Result<()>;

    /// The id of the array's task `index`, in the caller's scope (`NotFound` for an index not
    /// started, or out of scope).
    async fn array_task_id(&self, id: &str, index: u64, scope: &Scope) -> Result<String>;

    /// The array's started tasks by index from `from`, at most `limit`; `live` only the
    /// queued and running ones.
    async fn list_array_tasks(
        &self,
        id: &str,
        from: u64,
        limit: u32,
        live: bool,
    ) -> Result<Vec<Reservation>>;
}
