//! GPU quotas (`gpurent quotas`): a team's guaranteed GPUs of a type, and how much more it may
//! borrow while they are idle.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of `PUT /api/v1/quotas`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetQuota {
    /// The team (or user) it is for, by name.
    pub team: String,
    /// The GPU type, as `offers` names it (`rtx4090`, `h100`).
    pub gpu_type: String,
    /// Guaranteed GPUs, a decimal with up to three places (a share counts as its fraction).
    pub gpus: String,
    /// How many more it may borrow while they are idle; absent: any that are idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_limit: Option<String>,
}

/// A quota, with what its team uses of the type now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QuotaInfo {
    pub tenant_id: String,
    pub team: String,
    pub gpu_type: String,
    /// Guaranteed GPUs (`16`, `1.5`).
    pub gpus: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_limit: Option<String>,
    /// GPUs its live work holds of the type now.
    pub used: String,
    pub set_at: DateTime<Utc>,
}
