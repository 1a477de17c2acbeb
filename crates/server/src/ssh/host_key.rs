//! The SSH endpoint's host key: ed25519, shared by every replica (`shared_keys`), with a copy in
//! `DATA_DIR/ssh_host_ed25519_key` (OpenSSH format, 0600) and `.pub` beside it.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use gpurent_store::SharedKeyStore;
use gpurent_types::keyfile::{write_private, KeyFileError};

use russh::keys::ssh_key::private::{Ed25519Keypair, KeypairData};
use russh::keys::ssh_key::{HashAlg, LineEnding, PrivateKey};

use crate::secrets::KeyProvider;
use crate::shared_keys::{self, Found, SharedKeyError, SSH_HOST_KEY};

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
    #[error("the SSH host key {path} is not an OpenSSH private key: {reason}; move it away to use the database's (or make a new one)")]
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
    #[error(transparent)]
    Shared(#[from] SharedKeyError),
}

fn parse(bytes: &[u8]) -> Result<PrivateKey, String> {
    PrivateKey::from_openssh(bytes).map_err(|e| e.to_string())
}

/// A key's SHA-256 fingerprint, as messages name it.
fn identify(bytes: &[u8]) -> Result<String, String> {
    Ok(parse(bytes)?
        .public_key()
        .fingerprint(HashAlg::Sha256)
        .to_string())
}

fn generate() -> Result<Vec<u8>, String> {
    let key = PrivateKey::new(
        KeypairData::Ed25519(Ed25519Keypair::from_seed(&rand::random())),
        "gpurent host key",
    )
    .map_err(|e| e.to_string())?;
    let text = key.to_openssh(LineEnding::LF).map_err(|e| e.to_string())?;
    Ok(text.as_bytes().to_vec())
}

/// The host key every replica shares, from the database; the first start stores the one in
/// `data_dir` (an older version's), else a new one; one in `data_dir` that is not the
/// database's is refused. The data dir's copy and its `.pub` are written when missing.
pub async fn load_or_create(
    store: &dyn SharedKeyStore,
    master: &dyn KeyProvider,
    data_dir: &Path,
    now: DateTime<Utc>,
) -> Result<PrivateKey, HostKeyError> {
    let path = data_dir.join(HOST_KEY_FILE);
    let found = match shared_keys::read_if_there(&path) {
        Ok(Some(value)) => {
            // A broken file is an error, not a reason to take another key.
            parse(&value).map_err(|reason| HostKeyError::Malformed {
                path: path.clone(),
                reason,
            })?;
            Some(Found {
                path: path.clone(),
                value,
            })
        }
        Ok(None) => None,
        Err(source) => return Err(HostKeyError::Read { path, source }),
    };
    let had_copy = found.is_some();
    let loaded =
        shared_keys::load_or_store(store, master, SSH_HOST_KEY, found, identify, generate, now)
            .await?;
    let key = parse(&loaded.value).map_err(HostKeyError::Encode)?;
    if !had_copy {
        write_private(&path, &loaded.value)?;
    }
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

    #[tokio::test]
    async fn the_key_is_made_once_and_kept() {
        let (_db, store) = gpurent_store::testing::TestDatabase::sqlite_store()
            .await
            .unwrap();
        let master = crate::secrets::LocalKey::from_bytes(&[3; 32]);
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(&store, &master, dir.path(), Utc::now())
            .await
            .unwrap();
        let mode = std::fs::metadata(dir.path().join(HOST_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_file(dir.path().join("ssh_host_ed25519_key.pub")).unwrap();
        let second = load_or_create(&store, &master, dir.path(), Utc::now())
            .await
            .unwrap();
        assert_eq!(first.public_key(), second.public_key());
        let public = std::fs::read_to_string(dir.path().join("ssh_host_ed25519_key.pub")).unwrap();
        assert!(public.starts_with("ssh-ed25519 "), "{public}");
        // A replica with an empty data dir: the same key, from the database.
        let replica = tempfile::tempdir().unwrap();
        let shared = load_or_create(&store, &master, replica.path(), Utc::now())
            .await
            .unwrap();
        assert_eq!(first.public_key(), shared.public_key());
    }

    #[tokio::test]
    async fn a_data_dir_key_is_imported_and_a_different_one_refused() {
        let (_db, store) = gpurent_store::testing::TestDatabase::sqlite_store()
            .await
            .unwrap();
        let master = crate::secrets::LocalKey::from_bytes(&[3; 32]);
        let old = generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(HOST_KEY_FILE), &old).unwrap();
        let key = load_or_create(&store, &master, dir.path(), Utc::now())
            .await
            .unwrap();
        assert_eq!(key.public_key(), parse(&old).unwrap().public_key());
        let other = tempfile::tempdir().unwrap();
        let stranger = generate().unwrap();
        std::fs::write(other.path().join(HOST_KEY_FILE), &stranger).unwrap();
        let err = load_or_create(&store, &master, other.path(), Utc::now())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&identify(&old).unwrap()) && err.contains(&identify(&stranger).unwrap()),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_broken_key_file_is_an_error_not_a_new_key() {
        let (_db, store) = gpurent_store::testing::TestDatabase::sqlite_store()
            .await
            .unwrap();
        let master = crate::secrets::LocalKey::from_bytes(&[3; 32]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(HOST_KEY_FILE), "garbage").unwrap();
        let err = load_or_create(&store, &master, dir.path(), Utc::now())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an OpenSSH private key"), "{err}");
    }
}
