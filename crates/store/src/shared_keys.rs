//! The secrets every control-plane replica shares, sealed by the master key: the store keeps
//! only the sealed text (`SharedKeyStore`, implemented in `sql/shared_keys.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::Result;

#[async_trait]
pub trait SharedKeyStore: Send + Sync {
    /// The sealed value named `name`, if one was stored.
    async fn shared_key(&self, name: &str) -> Result<Option<String>>;

    /// Stores `sealed` under `name` unless a value is there already, and returns the value
    /// kept: `sealed`, or the one another replica stored first (never both, never a mix).
    async fn insert_shared_key(
        &self,
        name: &str,
        sealed: &str,
        now: DateTime<Utc>,
    ) -> Result<String>;
}
