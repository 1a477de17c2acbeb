//! What the protocol says of images: how far a pull is, the credential a pull may use, and
//! the images a node reports.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Assignment;

/// The name under which a reservation's secrets carry its owner's credential for its image's
/// registry (JSON `RegistryAuth`): a reserved name, so no executor puts it in an instance's
/// environment; the agent uses it for the pull only.
pub const REGISTRY_AUTH_SECRET: &str = "GPURENT_REGISTRY_AUTH";

/// A registry credential for one pull.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryAuth {
    pub host: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("host", &self.host)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Assignment {
    /// Its owner's credential for its image's registry, if it carries one.
    pub fn registry_auth(&self) -> Option<RegistryAuth> {
        serde_json::from_str(self.secrets.0.get(REGISTRY_AUTH_SECRET)?).ok()
    }
}

/// How far a node's pull of an instance's image is: layers and bytes (downloaded of those
/// whose size the registry said so far).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PullProgress {
    pub image: String,
    pub layers_done: u32,
    pub layers_total: u32,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// The most images a node reports.
pub const NODE_IMAGES_MAX: usize = 1000;

/// An image name as the Engine lists it: `:latest` where it names no tag.
pub fn image_with_tag(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains(':') || last.contains('@') {
        image.to_owned()
    } else {
        format!("{image}:latest")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_without_a_tag_are_latest() {
        assert_eq!(image_with_tag("busybox"), "busybox:latest");
        assert_eq!(
            image_with_tag("127.0.0.1:5000/x"),
            "127.0.0.1:5000/x:latest"
        );
        assert_eq!(image_with_tag("127.0.0.1:5000/x:1"), "127.0.0.1:5000/x:1");
        assert_eq!(image_with_tag("x@sha256:ab"), "x@sha256:ab");
    }
}
