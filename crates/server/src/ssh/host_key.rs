//! The SSH endpoint's host key: ed25519, made on first start and kept in
//! `DATA_DIR/ssh_host_ed25519_key` (OpenSSH private key format, 0600) with `.pub` beside it.

use std::path::{Path, PathBuf};

use gpurent_types::keyfile::{create_private, KeyFileError};

use russh::keys::ssh_key::private::{Ed25519Keypair, KeypairData};
use russh::keys::ssh_key::{LineEnding, PrivateKey};

/// The file name in the data dir (as OpenSSH names its own).
pub const HOST_KEY_FILE: &str = "ssh_host_ed25519_key";

#[derive(Debug, thiserror::Error)]
pub enum HostKeyError {
    #[error("cannot read the SSH host key {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the SSH host key {path} is not an OpenSSH private key: {reason}; move it away to make a new one")]
    Malformed { path: PathBuf, reason: String },
    #[error("cannot write the SSH host key {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    #[error("cannot encode the SSH host key: {0}")]
    Encode(String),
}

/// Loads the host key from `data_dir`, or makes and writes one the first time. The `.pub` is
/// written again when missing, so that it always matches the key served.
pub fn load_or_create(data_dir: &Path) -> Result<PrivateKey, HostKeyError> {
    let path = data_dir.join(HOST_KEY_FILE);
    let key = match std::fs::read_to_string(&path) {
        Ok(text) => {
            PrivateKey::from_openssh(text.as_bytes()).map_err(|e| HostKeyError::Malformed {
                path: path.clone(),
                reason: e.to_string(),
            })?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = PrivateKey::new(
                KeypairData::Ed25519(Ed25519Keypair::from_seed(&rand::random())),
                "gpurent host key",
            )
            .map_err(|e| HostKeyError::Encode(e.to_string()))?;
            let text = key
                .to_openssh(LineEnding::LF)
                .map_err(|e| HostKeyError::Encode(e.to_string()))?;
            create_private(&path, text.as_bytes())?;
            tracing::info!(path = %path.display(), "made the SSH host key");
            key
        }
        Err(source) => return Err(HostKeyError::Read { path, source }),
    };
    let public = path.with_extension("pub");
    let line = key
        .public_key()
        .to_openssh()
        .map_err(|e| HostKeyError::Encode(e.to_string()))?;
    let wanted = format!("{line}\n");
    if std::fs::read_to_string(&public).ok().as_deref() != Some(wanted.as_str()) {
        // Public: readable by anyone, as OpenSSH's own; a stale one (or a link) goes first.
        let _ = std::fs::remove_file(&public);
        std::fs::write(&public, wanted.as_bytes()).map_err(|source| HostKeyError::Write {
            path: public.clone(),
            source,
        })?;
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_key_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join(HOST_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_file(dir.path().join("ssh_host_ed25519_key.pub")).unwrap();
        let second = load_or_create(dir.path()).unwrap();
        assert_eq!(first.public_key(), second.public_key());
        let public = std::fs::read_to_string(dir.path().join("ssh_host_ed25519_key.pub")).unwrap();
        assert!(public.starts_with("ssh-ed25519 "), "{public}");
    }

    #[test]
    fn a_broken_key_file_is_an_error_not_a_new_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(HOST_KEY_FILE), "garbage").unwrap();
        let err = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not an OpenSSH private key"), "{err}");
    }
}
