//! The node's identity, kept in the agent's data dir so a restarted agent resumes its node.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::AgentError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    pub node_id: String,
    pub node_token: String,
    pub name: String,
}

impl NodeIdentity {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("node.json")
    }

    pub fn load(data_dir: &Path) -> Result<Option<Self>, AgentError> {
        let path = Self::path(data_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| AgentError::IdentityFormat { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(AgentError::Identity { path, source }),
        }
    }

    /// Writes the identity with mode 0600, atomically (temporary file, fsync, rename).
    pub fn save(&self, data_dir: &Path) -> Result<(), AgentError> {
        let path = Self::path(data_dir);
        let tmp = data_dir.join("node.json.tmp");
        let fail = |source| AgentError::Identity {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(data_dir).map_err(fail)?;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp).map_err(fail)?;
        let json = serde_json::to_vec_pretty(self).map_err(|e| AgentError::IdentityFormat {
            path: path.clone(),
            source: e,
        })?;
        file.write_all(&json).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        std::fs::rename(&tmp, &path).map_err(fail)
    }
}
