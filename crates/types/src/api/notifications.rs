//! Notifications (`gpurent notifications`): webhooks of a user or a team, each delivery a JSON
//! POST signed with HMAC-SHA256 and retried for a day, every attempt kept with its answer.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The events a webhook may ask for.
pub const NOTIFICATION_EVENTS: &[&str] = &[
    "budget_alert",
    "low_balance",
    "reservation_ended",
    "reservation_placed",
    "reservation_restarted",
    "node_lost",
    "node_unhealthy",
];

/// The body of `POST /api/v1/notifications`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddNotification {
    /// Where deliveries are POSTed: an http(s) URL whose host is a public address.
    pub url: String,
    /// A team of the caller's (its admins and owners add them); default: the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The events it gets (see `NOTIFICATION_EVENTS`); default: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
}

/// A webhook. Its `secret` is in the answer that made it, and never again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NotificationHook {
    pub id: String,
    /// The user or team whose events it gets.
    pub owner_id: String,
    pub url: String,
    pub events: Vec<String>,
    pub created_at: DateTime<Utc>,
    /// The HMAC-SHA256 key of its `X-Gpurent-Signature` header (`sha256=HEX` of the body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// One event to one webhook, and how its attempts went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NotificationDelivery {
    pub id: String,
    pub hook_id: String,
    /// The event: `budget_alert`, ..., or `test`.
    pub kind: String,
    /// `pending` (tried again at `next_at`), `delivered` or `failed` (a day of retries).
    pub state: String,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_at: Option<DateTime<Utc>>,
    /// The JSON that is POSTed.
    pub payload: serde_json::Value,
    pub attempts: Vec<DeliveryAttempt>,
}

/// An attempt: the HTTP status answered, or why there was none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryAttempt {
    pub attempt: u32,
    pub at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
