//! Tenants' registry credentials: the store's side of `gpurent registries` and of the pulls of
//! their images (`RegistryStore`, implemented in `sql/registries.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::Registry;

use crate::Result;

/// A credential to keep, its password sealed by the control plane.
#[derive(Debug, Clone)]
pub struct NewRegistry {
    pub owner_id: String,
    pub host: String,
    pub username: String,
    pub sealed_password: String,
}

#[async_trait]
pub trait RegistryStore: Send + Sync {
    /// Keeps the credential, replacing the owner's one for this host.
    async fn add_registry(&self, new: NewRegistry, now: DateTime<Utc>) -> Result<Registry>;

    /// The owner's credentials, by host.
    async fn list_registries(&self, owner_id: &str) -> Result<Vec<Registry>>;

    /// Removes the owner's credential for `host`; `NotFound` when they have none.
    async fn remove_registry(&self, owner_id: &str, host: &str) -> Result<Registry>;

    /// The owner's username and sealed password for `host`, if they keep one.
    async fn registry_secret(&self, owner_id: &str, host: &str)
        -> Result<Option<(String, String)>>;
}
