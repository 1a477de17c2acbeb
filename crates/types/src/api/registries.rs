//! A tenant's registry credentials (`gpurent registries`): used only for their own pulls, the
//! password never shown again.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A registry credential as it is shown: never its password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Registry {
    pub id: String,
    /// The registry's host, with its port if it has one, as image names give it.
    pub host: String,
    pub username: String,
    pub created_at: DateTime<Utc>,
}

/// The body of `POST /api/v1/registries`: adds the credential, or replaces the one for this
/// host.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddRegistry {
    /// `HOST[:PORT]` as image names give it; `docker.io` for images with no host in their
    /// name (`index.docker.io` is taken as `docker.io`).
    pub host: String,
    pub username: String,
    /// Kept sealed; never shown again.
    pub password: String,
}

/// The registry host an image names (`HOST[:PORT]/path:tag`), or None for an image of the
/// Engine's default registry (no host in its name: `pytorch/pytorch`, `busybox`). A first
/// part is a host when it has a dot or a port, or is `localhost`, as the Engine reads it.
pub fn registry_host(image: &str) -> Option<&str> {
    let (first, _) = image.split_once('/')?;
    (first.contains('.') || first.contains(':') || first == "localhost").then_some(first)
}

/// The host of the Engine's default registry, as credentials name it.
pub const DEFAULT_REGISTRY: &str = "docker.io";

/// The registry an image is pulled from, as credentials name it: its host, or
/// [`DEFAULT_REGISTRY`] when its name has none (`pytorch/pytorch`, `busybox`).
pub fn registry_of(image: &str) -> &str {
    registry_host(image).map_or(DEFAULT_REGISTRY, canonical_host)
}

/// A registry host as credentials name it: the default registry's other names
/// (`index.docker.io`, `registry-1.docker.io`) are `docker.io`, as the Engine reads them.
pub fn canonical_host(host: &str) -> &str {
    match host {
        "index.docker.io" | "registry-1.docker.io" => DEFAULT_REGISTRY,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_as_the_engine_reads_them() {
        assert_eq!(
            registry_host("127.0.0.1:5000/a/b:1"),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            registry_host("registry.example/x"),
            Some("registry.example")
        );
        assert_eq!(registry_host("localhost/x"), Some("localhost"));
        assert_eq!(registry_host("pytorch/pytorch:2.5"), None);
        assert_eq!(registry_host("busybox"), None);
    }

    #[test]
    fn an_image_without_a_host_is_of_the_default_registry() {
        assert_eq!(registry_of("pytorch/pytorch:2.5"), "docker.io");
        assert_eq!(registry_of("busybox"), "docker.io");
        assert_eq!(registry_of("docker.io/library/busybox"), "docker.io");
        assert_eq!(registry_of("index.docker.io/library/busybox"), "docker.io");
        assert_eq!(registry_of("127.0.0.1:5000/a:1"), "127.0.0.1:5000");
        assert_eq!(canonical_host("registry-1.docker.io"), "docker.io");
    }
}
