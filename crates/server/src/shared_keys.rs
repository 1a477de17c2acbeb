//! The secrets every replica of the control plane shares (node CA, audit key, SSH host key,
//! self-signed certificate), sealed by the master key in the database: stored once, read back.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use gpurent_store::{SharedKeyStore, StoreError};

use crate::secrets::{open_bytes, seal_bytes, KeyProvider, SecretsError};

/// One of the shared secrets: its row's name and what messages call it.
#[derive(Debug, Clone, Copy)]
pub struct SharedKey {
    /// The row in `shared_keys`; also bound to the ciphertext, so that one row's value does
    /// not open as another's.
    pub name: &'static str,
    /// What messages call it ("the node CA").
    pub what: &'static str,
}

pub const NODE_CA: SharedKey = SharedKey {
    name: "node-ca",
    what: "the node CA",
};
pub const AUDIT_KEY: SharedKey = SharedKey {
    name: "audit-signing-key",
    what: "the audit signing key",
};
pub const SSH_HOST_KEY: SharedKey = SharedKey {
    name: "ssh-host-key",
    what: "the SSH host key",
};
pub const SELF_SIGNED_TLS: SharedKey = SharedKey {
    name: "tls-self-signed",
    what: "the self-signed TLS certificate",
};

#[derive(Debug, thiserror::Error)]
pub enum SharedKeyError {
    #[error("cannot read or store {what} in the database")]
    Store {
        what: &'static str,
        #[source]
        source: StoreError,
    },
    #[error(
        "{what} in the database is sealed with master key {sealed_with}, but this control plane \
         was given master key {given}: give every replica the master key of the first one \
         (GPURENT_MASTER_KEY or --master-key-file)"
    )]
    WrongMasterKey {
        what: &'static str,
        sealed_with: String,
        given: String,
    },
    #[error(
        "{what} in the database does not open with master key {given} (damaged, or sealed \
         under another key): {source}"
    )]
    Open {
        what: &'static str,
        given: String,
        #[source]
        source: SecretsError,
    },
    #[error(
        "{what} in {path} ({local}) is not the one in the database ({shared}): refusing to \
         start rather than switch to either; move {path} away to use the database's, or give \
         this replica the database its data dir was used with"
    )]
    Conflict {
        what: &'static str,
        path: PathBuf,
        local: String,
        shared: String,
    },
    #[error("{what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error("cannot seal {what}: {source}")]
    Seal {
        what: &'static str,
        #[source]
        source: SecretsError,
    },
}

/// A copy of a shared secret found in the data dir (an older version kept them there).
#[derive(Debug)]
pub struct Found {
    /// The file that holds it, for messages.
    pub path: PathBuf,
    pub value: Vec<u8>,
}

/// Where the value came from on this start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Another start stored it; this one read it.
    Database,
    /// This start stored the copy found in the data dir.
    Imported,
    /// This start made it.
    Made,
}

/// A shared secret, opened.
#[derive(Debug)]
pub struct Loaded {
    pub value: Vec<u8>,
    pub origin: Origin,
}

fn purpose(key: SharedKey) -> Vec<u8> {
    format!("gpurent-shared-key-v1:{}", key.name).into_bytes()
}

/// Reads `key` from the store, or stores it: `found` (imported from the data dir) or else
/// what `make` makes. `identify` names a value for messages (a fingerprint or public key, never
/// the secret) and decides whether the data dir's copy is the database's: a copy that is not
/// is refused (`Conflict`), whichever was there first.
pub async fn load_or_store(
    store: &dyn SharedKeyStore,
    master: &dyn KeyProvider,
    key: SharedKey,
    found: Option<Found>,
    identify: impl Fn(&[u8]) -> Result<String, String>,
    make: impl FnOnce() -> Result<Vec<u8>, String>,
    now: DateTime<Utc>,
) -> Result<Loaded, SharedKeyError> {
    let what = key.what;
    let invalid = |reason: String| SharedKeyError::Invalid { what, reason };
    let stored = store
        .shared_key(key.name)
        .await
        .map_err(|source| SharedKeyError::Store { what, source })?;
    let (sealed, offered) = match stored {
        Some(sealed) => (sealed, None),
        None => {
            let (value, origin) = match &found {
                Some(found) => (found.value.clone(), Origin::Imported),
                None => (make().map_err(invalid)?, Origin::Made),
            };
            // What is stored must be usable by every replica: checked before it is.
            identify(&value).map_err(invalid)?;
            let sealed = seal_bytes(master, &value, &purpose(key))
                .map_err(|source| SharedKeyError::Seal { what, source })?;
            let kept = store
                .insert_shared_key(key.name, &sealed, now)
                .await
                .map_err(|source| SharedKeyError::Store { what, source })?;
            let won = kept == sealed;
            (kept, won.then_some(origin))
        }
    };
    let value = open_bytes(master, &sealed, &purpose(key)).map_err(|source| match source {
        SecretsError::UnknownKey(sealed_with) => SharedKeyError::WrongMasterKey {
            what,
            sealed_with,
            given: master.key_id().to_owned(),
        },
        source => SharedKeyError::Open {
            what,
            given: master.key_id().to_owned(),
            source,
        },
    })?;
    let shared = identify(&value).map_err(invalid)?;
    let from = found.as_ref().map(|f| f.path.display().to_string());
    if let Some(found) = found {
        let local = identify(&found.value).map_err(invalid)?;
        if local != shared {
            return Err(SharedKeyError::Conflict {
                what,
                path: found.path,
                local,
                shared,
            });
        }
    }
    let origin = offered.unwrap_or(Origin::Database);
    match origin {
        Origin::Database => tracing::debug!(key = key.name, "{what} read from the database"),
        Origin::Imported => {
            tracing::info!(
                key = key.name,
                from = from.as_deref().unwrap_or_default(),
                "{what} imported into the database, sealed by the master key"
            )
        }
        Origin::Made => tracing::info!(
            key = key.name,
            "made {what}; kept in the database, sealed by the master key"
        ),
    }
    Ok(Loaded { value, origin })
}

/// A file's bytes, `None` when it does not exist.
pub fn read_if_there(path: &Path) -> Result<Option<Vec<u8>>, std::io::Error> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
