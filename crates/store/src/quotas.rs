//! GPU quotas: the store's side of `gpurent quotas` (`QuotaStore`, in `sql/quotas.rs`). Where
//! new work stands against them is `sched::quota`'s to say; the placement transaction reads
//! the facts (`sql/quotas.rs`, `standing_of`) and applies it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_sched::quota::Quota;

use crate::Result;

/// A quota as kept, with what its tenant's live work holds of the type now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaRow {
    pub tenant_id: String,
    pub tenant_name: String,
    pub type_key: String,
    pub quota: Quota,
    /// Milli-GPUs its live work holds of the type.
    pub used: u64,
    pub set_at: DateTime<Utc>,
}

#[async_trait]
pub trait QuotaStore: Send + Sync {
    /// Sets (or replaces) a tenant's quota of a GPU type.
    async fn set_quota(
        &self,
        tenant_id: &str,
        type_key: &str,
        quota: Quota,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// Removes it; whether there was one.
    async fn remove_quota(&self, tenant_id: &str, type_key: &str) -> Result<bool>;

    /// Every quota, by type then tenant name.
    async fn quotas(&self) -> Result<Vec<QuotaRow>>;
}
