//! Templates: a named instance setup (image, command, environment, published ports, where a
//! volume goes) that `reserve --template NAME` starts from (`gpurent templates`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The most templates one user keeps.
pub const TEMPLATES_MAX: usize = 200;

/// A template, as `gpurent templates ls|get` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Template {
    pub id: String,
    pub name: String,
    /// The image its instances run; none: an isolated process (the `shell` template).
    #[serde(default)]
    pub image: Option<String>,
    /// The program and its arguments; empty: the image's own command, or without an image an
    /// interactive instance that stays up for its hours.
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Ports published over HTTP through the control plane (`/proxy/ID/PORT/`).
    #[serde(default)]
    pub http_ports: Vec<u16>,
    /// Where `reserve --template T --volume NAME` mounts a volume given without a path.
    #[serde(default)]
    pub volume_mount: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Everyone's (made by an admin, or shipped with gpurent); else its owner's only.
    pub public: bool,
    /// Its owner's name; none for those shipped with gpurent.
    #[serde(default)]
    pub owner: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// The body of `POST /api/v1/templates`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTemplate {
    /// 1 to 64 letters, digits and `- _ .`, starting with a letter or digit.
    pub name: String,
    /// The image its instances run; none: an isolated process (on any node).
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub http_ports: Vec<u16>,
    #[serde(default)]
    pub volume_mount: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// For everyone (admins only).
    #[serde(default)]
    pub public: bool,
}
