//! Notifications: the store's side of `gpurent notifications` (`NotificationStore`, in
//! `sql/notifications.rs`): webhooks, the deliveries queued once per hook and event, their
//! attempts, and the platform's events that feed them. Retries and signing are the server's.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{NotificationDelivery, NotificationHook};

use crate::Result;

/// A webhook as kept: its secret sealed.
#[derive(Debug, Clone)]
pub struct HookRow {
    pub hook: NotificationHook,
    pub secret_sealed: String,
    pub created_by: String,
}

/// A delivery due to be tried.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub id: String,
    pub hook_id: String,
    pub url: String,
    pub secret_sealed: String,
    pub kind: String,
    pub payload: String,
    pub attempts: u32,
    pub created_at: DateTime<Utc>,
    pub next_at: DateTime<Utc>,
}

/// What became of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    Delivered,
    /// Tried again then.
    Retry(DateTime<Utc>),
    /// A day of retries: no more.
    GiveUp,
}

/// An event of the platform's about what a tenant or host owns, to be told to its webhooks:
/// `reservation_ended` (by the platform; `detail` its end reason), `reservation_placed` (from
/// the queue), `reservation_restarted` (a managed job's run ended and it is queued again;
/// `detail`: how many times so far), `node_lost`, `node_unhealthy` (`detail`: what it breached).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformEvent {
    pub owner_id: String,
    pub kind: &'static str,
    /// The reservation's or the node's id.
    pub subject: String,
    pub detail: Option<String>,
    pub at: DateTime<Utc>,
}

#[async_trait]
pub trait NotificationStore: Send + Sync {
    async fn add_hook(&self, row: &HookRow) -> Result<()>;

    /// The webhooks of a user or team, oldest first.
    async fn hooks(&self, owner_id: &str) -> Result<Vec<HookRow>>;

    async fn hook(&self, id: &str) -> Result<Option<HookRow>>;

    /// Removes it with its deliveries and their attempts; whether it was there.
    async fn remove_hook(&self, id: &str) -> Result<bool>;

    /// Queues the event for every webhook of `owner_id` that asked for `kind` (or only for
    /// `hook_id`, a test), once per hook and `event_key`; how many were queued now.
    async fn enqueue(
        &self,
        owner_id: &str,
        hook_id: Option<&str>,
        kind: &str,
        event_key: &str,
        payload: &str,
        now: DateTime<Utc>,
    ) -> Result<u64>;

    /// Pending deliveries due at `now`, oldest first, at most `limit`.
    async fn due_deliveries(&self, now: DateTime<Utc>, limit: u32) -> Result<Vec<DueDelivery>>;

    /// Claims a due delivery until `until` (a compare-and-set on its `next_at`): false when
    /// another replica took it.
    async fn claim_delivery(
        &self,
        id: &str,
        next_at: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool>;

    /// Records attempt `attempt` of a delivery and what became of it.
    async fn record_attempt(
        &self,
        id: &str,
        attempt: u32,
        at: DateTime<Utc>,
        status: Option<u16>,
        error: Option<&str>,
        outcome: AttemptOutcome,
    ) -> Result<()>;

    /// Forgets deliveries done (delivered or failed) that were queued before `before`, with
    /// their attempts; how many.
    async fn prune_deliveries(&self, before: DateTime<Utc>) -> Result<u64>;

    /// A webhook's deliveries, newest first, at most `limit`, with their attempts.
    async fn deliveries(&self, hook_id: &str, limit: u32) -> Result<Vec<NotificationDelivery>>;

    /// The events at or after `since` of the users and teams that have a webhook: their
    /// reservations the platform ended (for one of `reasons`) or placed from the queue, and
    /// their nodes lost or unhealthy.
    async fn platform_events(
        &self,
        since: DateTime<Utc>,
        reasons: &[&str],
    ) -> Result<Vec<PlatformEvent>>;
}
