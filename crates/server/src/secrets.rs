//! Tenants' secrets at rest: envelope encryption with AES-256-GCM. Each sealed value has its
//! own data key, itself sealed by the master key (a `KeyProvider`: a local key from a file or
//! the environment, or a KMS behind the same two calls); the store only ever sees ciphertext.

use std::collections::BTreeMap;
use std::sync::Arc;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const NONCE_BYTES: usize = 12;
/// Bound to every sealed value: a ciphertext made for something else does not open here.
const PURPOSE: &[u8] = b"gpurent-reservation-secrets-v1";

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("a master key is 32 bytes in hex (64 characters)")]
    KeyFormat,
    #[error("sealed with master key {0}, which this control plane does not have")]
    UnknownKey(String),
    #[error("the sealed secrets are damaged or were sealed under another key")]
    Open,
    #[error("the secrets could not be sealed")]
    Seal,
    #[error("the sealed secrets are not valid")]
    Format,
}

/// Wraps and unwraps data keys with a master key it never hands out (a KMS can be one).
pub trait KeyProvider: Send + Sync + std::fmt::Debug {
    /// Names the master key, so that a sealed value says which key opens it.
    fn key_id(&self) -> &str;
    fn wrap(&self, data_key: &[u8; 32]) -> Result<Vec<u8>, SecretsError>;
    fn unwrap(&self, wrapped: &[u8]) -> Result<[u8; 32], SecretsError>;
}

fn seal_with(key: &Aes256Gcm, plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>, SecretsError> {
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let mut out = nonce.to_vec();
    let sealed = key
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .map_err(|_| SecretsError::Seal)?;
    out.extend(sealed);
    Ok(out)
}

fn open_with(key: &Aes256Gcm, sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, SecretsError> {
    if sealed.len() < NONCE_BYTES {
        return Err(SecretsError::Format);
    }
    let (nonce, ciphertext) = sealed.split_at(NONCE_BYTES);
    key.decrypt(
        Nonce::from_slice(nonce),
        Payload {
            msg: ciphertext,
            aad,
        },
    )
    .map_err(|_| SecretsError::Open)
}

/// A master key held by this process (`--master-key-file`, or `GPURENT_MASTER_KEY`).
pub struct LocalKey {
    id: String,
    key: Aes256Gcm,
}

impl std::fmt::Debug for LocalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself.
        write!(f, "LocalKey({})", self.id)
    }
}

impl LocalKey {
    /// From 64 hex characters; its id is the start of the SHA-256 of the key.
    pub fn from_hex(text: &str) -> Result<LocalKey, SecretsError> {
        let bytes = hex::decode(text.trim()).map_err(|_| SecretsError::KeyFormat)?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| SecretsError::KeyFormat)?;
        Ok(LocalKey::from_bytes(&bytes))
    }

    pub fn from_bytes(bytes: &[u8; 32]) -> LocalKey {
        LocalKey {
            id: format!("local:{}", &hex::encode(Sha256::digest(bytes))[..16]),
            key: Aes256Gcm::new(bytes.into()),
        }
    }

    /// A new random key, in hex (for the key file).
    pub fn generate_hex() -> String {
        hex::encode(rand::random::<[u8; 32]>())
    }
}

impl KeyProvider for LocalKey {
    fn key_id(&self) -> &str {
        &self.id
    }

    fn wrap(&self, data_key: &[u8; 32]) -> Result<Vec<u8>, SecretsError> {
        seal_with(&self.key, data_key, self.id.as_bytes())
    }

    fn unwrap(&self, wrapped: &[u8]) -> Result<[u8; 32], SecretsError> {
        let key = open_with(&self.key, wrapped, self.id.as_bytes())?;
        key.try_into().map_err(|_| SecretsError::Format)
    }
}

/// What the store keeps: the master key's id, the wrapped data key, and the secrets sealed
/// under the data key (hex).
#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    key_id: String,
    data_key: String,
    sealed: String,
}

/// Seals bytes under a fresh data key wrapped by the master key; `purpose` is bound to the
/// ciphertext (what was sealed for one purpose does not open for another).
pub fn seal_bytes(
    provider: &dyn KeyProvider,
    plaintext: &[u8],
    purpose: &[u8],
) -> Result<String, SecretsError> {
    let data_key: [u8; 32] = rand::random();
    let sealed = seal_with(&Aes256Gcm::new((&data_key).into()), plaintext, purpose)?;
    let envelope = Envelope {
        key_id: provider.key_id().to_owned(),
        data_key: hex::encode(provider.wrap(&data_key)?),
        sealed: hex::encode(sealed),
    };
    serde_json::to_string(&envelope).map_err(|_| SecretsError::Seal)
}

/// Opens what `seal_bytes` made for the same purpose.
pub fn open_bytes(
    provider: &dyn KeyProvider,
    sealed: &str,
    purpose: &[u8],
) -> Result<Vec<u8>, SecretsError> {
    let envelope: Envelope = serde_json::from_str(sealed).map_err(|_| SecretsError::Format)?;
    if envelope.key_id != provider.key_id() {
        return Err(SecretsError::UnknownKey(envelope.key_id));
    }
    let wrapped = hex::decode(&envelope.data_key).map_err(|_| SecretsError::Format)?;
    let data_key = provider.unwrap(&wrapped)?;
    let sealed = hex::decode(&envelope.sealed).map_err(|_| SecretsError::Format)?;
    open_with(&Aes256Gcm::new((&data_key).into()), &sealed, purpose)
}

/// Seals a reservation's secrets (name to value) for the store.
pub fn seal(
    provider: &dyn KeyProvider,
    secrets: &BTreeMap<String, String>,
) -> Result<String, SecretsError> {
    let plaintext = serde_json::to_vec(secrets).map_err(|_| SecretsError::Seal)?;
    seal_bytes(provider, &plaintext, PURPOSE)
}

/// Opens what `seal` made.
pub fn open(
    provider: &dyn KeyProvider,
    sealed: &str,
) -> Result<BTreeMap<String, String>, SecretsError> {
    let plaintext = open_bytes(provider, sealed, PURPOSE)?;
    serde_json::from_slice(&plaintext).map_err(|_| SecretsError::Format)
}

/// The master key of the control plane, shared by its handlers.
pub type MasterKey = Arc<dyn KeyProvider>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn secrets() -> BTreeMap<String, String> {
        [("HF_TOKEN".to_owned(), "hf_abc123".to_owned())].into()
    }

    #[test]
    fn what_is_sealed_opens_only_under_its_key() {
        let key = LocalKey::from_bytes(&[1; 32]);
        let sealed = seal(&key, &secrets()).unwrap();
        assert!(!sealed.contains("hf_abc123"));
        assert!(!sealed.contains("HF_TOKEN"), "names are sealed too");
        assert_eq!(open(&key, &sealed).unwrap(), secrets());
        // Each seal has its own data key and nonce.
        assert_ne!(seal(&key, &secrets()).unwrap(), sealed);
        let other = LocalKey::from_bytes(&[2; 32]);
        assert!(matches!(
            open(&other, &sealed),
            Err(SecretsError::UnknownKey(_))
        ));
    }

    #[test]
    fn tampering_is_refused() {
        let key = LocalKey::from_bytes(&[1; 32]);
        let sealed = seal(&key, &secrets()).unwrap();
        let mut envelope: Envelope = serde_json::from_str(&sealed).unwrap();
        let mut bytes = hex::decode(&envelope.sealed).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        envelope.sealed = hex::encode(bytes);
        let tampered = serde_json::to_string(&envelope).unwrap();
        assert!(matches!(open(&key, &tampered), Err(SecretsError::Open)));
        assert!(matches!(open(&key, "not json"), Err(SecretsError::Format)));
        assert!(LocalKey::from_hex("abcd").is_err());
        assert!(!format!("{key:?}").contains(&hex::encode([1u8; 32])));
    }
}
