//! The audit trail: its records, pages, checkpoints and what a verification found.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One API request as the audit trail keeps it, chained to the record before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditRecord {
    /// Its position in the trail: 1, 2, 3, ...
    pub seq: u64,
    pub request_id: String,
    pub at: DateTime<Utc>,
    /// Who made it (`node:<id>` for an agent); null when no one was authenticated.
    pub user_id: Option<String>,
    /// `METHOD /route/{template}`.
    pub action: String,
    /// The path it acted on.
    pub resource: String,
    /// The reservation and GPUs involved, where one was.
    pub allocation: Option<String>,
    /// The HTTP status answered.
    pub outcome: u16,
    /// The client's address.
    pub client: String,
    /// SHA-256 (hex) of the record before it, and of this one.
    pub prev_hash: String,
    pub hash: String,
}

/// A page of audit records; ask again with `after = next_after` for more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    pub records: Vec<AuditRecord>,
    /// Null when this page is the last.
    pub next_after: Option<u64>,
}

/// A signed checkpoint of the trail's head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditCheckpoint {
    pub seq: u64,
    pub hash: String,
    pub at: DateTime<Utc>,
    /// Ed25519 signature (hex) by `public_key`.
    pub signature: String,
    pub public_key: String,
    /// The checkpoint the retained trail continues from after older records were pruned.
    pub anchor: bool,
}

/// What verification of the whole retained trail found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditVerdict {
    pub ok: bool,
    /// Records read.
    pub records: u64,
    /// Signed checkpoints the chain matched.
    pub checkpoints: u64,
    /// The first record altered, removed or out of place; null when `ok`.
    pub first_bad: Option<AuditProblem>,
    /// The server's key (hex) the checkpoints were verified with.
    pub public_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditProblem {
    /// The position of the record concerned.
    pub seq: u64,
    /// `altered`, `missing`, `out_of_order`, `rewritten` or `bad_signature`.
    pub problem: String,
    pub message: String,
}
