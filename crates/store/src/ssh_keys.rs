//! Users' SSH public keys: the store's side of `gpurent keys` and of the SSH endpoint's
//! authentication (`SshKeyStore`, implemented in `sql/ssh_keys.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::SshKey;

use crate::Result;

/// A key to store, already parsed and checked by the control plane.
#[derive(Debug, Clone)]
pub struct NewSshKey {
    pub user_id: String,
    pub name: String,
    pub algorithm: String,
    /// `SHA256:...`, as `ssh-keygen -lf` prints it.
    pub fingerprint: String,
    /// OpenSSH's one-line form, without the comment.
    pub public_key: String,
}

#[async_trait]
pub trait SshKeyStore: Send + Sync {
    /// `Duplicate` when the user has this key already.
    async fn add_ssh_key(&self, new: NewSshKey, now: DateTime<Utc>) -> Result<SshKey>;

    /// Keys of `user_id` (all users' for `None`), newest first, at most `limit` after the
    /// key `after`.
    async fn list_ssh_keys(
        &self,
        user_id: Option<&str>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Vec<SshKey>>;

    /// Removes key `id` of `user_id` (any user's for `None`). NotFound for another user's key,
    /// as for none.
    async fn remove_ssh_key(&self, id: &str, user_id: Option<&str>) -> Result<SshKey>;

    /// The user's key with this fingerprint, if it has one (the SSH endpoint's question).
    async fn ssh_key_by_fingerprint(
        &self,
        user_id: &str,
        fingerprint: &str,
    ) -> Result<Option<SshKey>>;
}
