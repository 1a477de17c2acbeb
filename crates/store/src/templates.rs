//! Templates: the store's side of `gpurent templates` and of `reserve --template`
//! (`TemplateStore`, implemented in `sql/templates.rs`).

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::Template;

use crate::Result;

/// A template to store, checked by the control plane.
#[derive(Debug, Clone)]
pub struct NewTemplate {
    pub owner_id: String,
    pub name: String,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub http_ports: Vec<u16>,
    pub volume_mount: Option<String>,
    pub description: Option<String>,
    pub public: bool,
}

#[async_trait]
pub trait TemplateStore: Send + Sync {
    /// `Duplicate` when the owner has a template of this name, or a public one has it (for a
    /// public one).
    async fn create_template(&self, new: NewTemplate, now: DateTime<Utc>) -> Result<Template>;

    /// The templates `viewer` may use: their own and the public ones, by name (their own first
    /// where both have one).
    async fn list_templates(&self, viewer: &str) -> Result<Vec<Template>>;

    /// The template `viewer` means by this name or id: their own, else a public one.
    /// `NotFound` for another user's, as for none.
    async fn template(&self, viewer: &str, name_or_id: &str) -> Result<Template>;

    /// Removes the template `id` (whose it is and who may remove it is the caller's question).
    async fn remove_template(&self, id: &str) -> Result<()>;
}
