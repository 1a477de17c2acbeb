//! Signed checkpoints: the server's Ed25519 key signs the chain's head (its position, hash and
//! time) every so often, so that a chain rewritten from some record on no longer matches.

use chrono::{DateTime, Utc};
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The record it signs (its `seq`), and that record's hash.
    pub seq: u64,
    pub hash: String,
    pub at: DateTime<Utc>,
    /// Ed25519 signature (hex) of `message(seq, hash, at)`.
    pub signature: String,
    /// The signing key's public half (hex), to tell keys apart after a rotation.
    pub public_key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("an audit key is 32 bytes in hex (64 characters): {0}")]
    Format(String),
}

/// What a checkpoint signs.
fn message(seq: u64, hash: &str, at: DateTime<Utc>) -> Vec<u8> {
    let mut m = b"gpurent-audit-checkpoint-v1".to_vec();
    m.extend(seq.to_be_bytes());
    m.extend(at.timestamp_micros().to_be_bytes());
    m.extend(hash.as_bytes());
    m
}

fn key_bytes(hex_text: &str) -> Result<[u8; 32], KeyError> {
    let bytes = hex::decode(hex_text.trim()).map_err(|e| KeyError::Format(e.to_string()))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| KeyError::Format(format!("{} bytes", bytes.len())))
}

/// The server's signing key.
pub struct Signer {
    key: SigningKey,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret half.
        write!(f, "Signer({})", self.public_key())
    }
}

impl Signer {
    /// A key from 32 random bytes (the caller's randomness: this crate does no I/O).
    pub fn from_seed(seed: [u8; 32]) -> Signer {
        Signer {
            key: SigningKey::from_bytes(&seed),
        }
    }

    /// A key as `seed_hex` writes it.
    pub fn from_seed_hex(text: &str) -> Result<Signer, KeyError> {
        Ok(Signer::from_seed(key_bytes(text)?))
    }

    /// The secret seed in hex, for the key file.
    pub fn seed_hex(&self) -> String {
        hex::encode(self.key.to_bytes())
    }

    pub fn public_key(&self) -> String {
        hex::encode(self.key.verifying_key().to_bytes())
    }

    pub fn sign(&self, seq: u64, hash: &str, at: DateTime<Utc>) -> Checkpoint {
        let signature = self.key.sign(&message(seq, hash, at));
        Checkpoint {
            seq,
            hash: hash.to_owned(),
            at,
            signature: hex::encode(signature.to_bytes()),
            public_key: self.public_key(),
        }
    }
}

impl Checkpoint {
    /// Whether `public_key` (hex) signed exactly this checkpoint.
    pub fn signed_by(&self, public_key: &str) -> bool {
        let Ok(key) = key_bytes(public_key) else {
            return false;
        };
        let Ok(key) = VerifyingKey::from_bytes(&key) else {
            return false;
        };
        let Ok(signature) = hex::decode(&self.signature) else {
            return false;
        };
        let Ok(signature) = Signature::from_slice(&signature) else {
            return false;
        };
        key.verify(&message(self.seq, &self.hash, self.at), &signature)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_verifies_only_as_signed() {
        let signer = Signer::from_seed([7; 32]);
        let at = DateTime::<Utc>::UNIX_EPOCH;
        let c = signer.sign(1000, "ab", at);
        assert!(c.signed_by(&signer.public_key()));
        let other = Signer::from_seed([8; 32]);
        assert!(!c.signed_by(&other.public_key()));
        for changed in [
            Checkpoint {
                seq: 1001,
                ..c.clone()
            },
            Checkpoint {
                hash: "ac".into(),
                ..c.clone()
            },
            Checkpoint {
                at: at + chrono::Duration::microseconds(1),
                ..c.clone()
            },
            Checkpoint {
                signature: "00".into(),
                ..c.clone()
            },
        ] {
            assert!(!changed.signed_by(&signer.public_key()), "{changed:?}");
        }
        let again = Signer::from_seed_hex(&signer.seed_hex())
            .unwrap_or_else(|_| Signer::from_seed([0; 32]));
        assert_eq!(again.public_key(), signer.public_key());
        assert!(Signer::from_seed_hex("abcd").is_err());
        assert!(!format!("{signer:?}").contains(&signer.seed_hex()));
    }
}
