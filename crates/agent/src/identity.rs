//! The node's identity, kept in the agent's data dir so a restarted agent resumes its node.

use std::path::{Path, PathBuf};

use gpurent_types::keyfile;

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
        let json = serde_json::to_vec_pretty(self).map_err(|e| AgentError::IdentityFormat {
            path: path.clone(),
            source: e,
        })?;
        write_private(data_dir, &path, &json)
    }

    /// The node's client certificate and its key (`node.crt`, `node.key`): the key is made on
    /// the node and never leaves it; the control plane's CA signed the certificate at join.
    pub fn cert_paths(data_dir: &Path) -> (PathBuf, PathBuf) {
        (data_dir.join("node.crt"), data_dir.join("node.key"))
    }

    /// The client certificate, if this node joined over TLS.
    pub fn client_cert(data_dir: &Path) -> Option<(PathBuf, PathBuf)> {
        let (cert, key) = Self::cert_paths(data_dir);
        (cert.exists() && key.exists()).then_some((cert, key))
    }

    /// Keeps the node's key, its certificate and the CA that signed it (`node-ca.pem`).
    pub fn save_certificate(
        data_dir: &Path,
        key_pem: &str,
        cert_pem: &str,
        ca_pem: Option<&str>,
    ) -> Result<(), AgentError> {
        let (cert, key) = Self::cert_paths(data_dir);
        write_private(data_dir, &key, key_pem.as_bytes())?;
        write_private(data_dir, &cert, cert_pem.as_bytes())?;
        if let Some(ca) = ca_pem {
            write_private(data_dir, &data_dir.join("node-ca.pem"), ca.as_bytes())?;
        }
        Ok(())
    }
}

/// Writes a file of the data dir (made if missing) with mode 0600, atomically.
fn write_private(data_dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), AgentError> {
    std::fs::create_dir_all(data_dir).map_err(|source| AgentError::Identity {
        path: path.to_owned(),
        source,
    })?;
    Ok(keyfile::write_private(path, bytes)?)
}
