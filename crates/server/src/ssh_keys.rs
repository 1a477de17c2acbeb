//! Which SSH public keys a user may add (ed25519, ECDSA, RSA of at least 3072 bits) and their
//! fingerprints, exactly as `ssh-keygen -lf` prints them. Pure: no I/O.

use ssh_key::public::KeyData;
use ssh_key::{HashAlg, PublicKey};

/// RSA keys shorter than this are refused (NIST SP 800-57: 3072 bits for use past 2030).
pub const MIN_RSA_BITS: usize = 3072;
/// Longer than any key OpenSSH makes (an RSA key of 16384 bits is about 2,800 characters).
const MAX_KEY_TEXT: usize = 16 * 1024;

/// A key that may be added, in the forms the store and the SSH endpoint compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedKey {
    /// `ssh-ed25519`, `ecdsa-sha2-nistp256`, `ssh-rsa`, ...
    pub algorithm: String,
    /// `SHA256:...` (base64 without padding).
    pub fingerprint: String,
    /// One line, without the comment.
    pub openssh: String,
    /// The comment the key came with (often `user@host`); empty when none.
    pub comment: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "public_key: give one key, the one line of a .pub file (\"ssh-ed25519 AAAA... comment\")"
    )]
    NotOneLine,
    #[error("public_key: longer than {MAX_KEY_TEXT} characters")]
    TooLong,
    #[error("public_key: not an OpenSSH public key ({0}); give the one line of a .pub file")]
    Malformed(String),
    #[error("public_key: {0} keys are not accepted; use ed25519 (ssh-keygen -t ed25519), ECDSA or RSA of at least {MIN_RSA_BITS} bits")]
    Unsupported(String),
    #[error("public_key: this RSA key has {0} bits; RSA keys need at least {MIN_RSA_BITS} (ssh-keygen -t rsa -b 4096), or use ed25519")]
    RsaTooShort(usize),
}

/// Checks one OpenSSH public key line.
pub fn check(text: &str) -> Result<CheckedKey, KeyError> {
    if text.len() > MAX_KEY_TEXT {
        return Err(KeyError::TooLong);
    }
    let line = text.trim();
    if line.is_empty() || line.lines().count() != 1 {
        return Err(KeyError::NotOneLine);
    }
    let key = PublicKey::from_openssh(line).map_err(|e| KeyError::Malformed(e.to_string()))?;
    let algorithm = key.algorithm().as_str().to_owned();
    match key.key_data() {
        KeyData::Ed25519(_) | KeyData::Ecdsa(_) => {}
        KeyData::Rsa(rsa) => {
            let bits = rsa.n().as_positive_bytes().map_or(0, |n| {
                n.first()
                    .map_or(0, |&b| n.len() * 8 - b.leading_zeros() as usize)
            });
            if bits < MIN_RSA_BITS {
                return Err(KeyError::RsaTooShort(bits));
            }
        }
        _ => return Err(KeyError::Unsupported(algorithm)),
    }
    let mut bare = key.clone();
    bare.set_comment("");
    let openssh = bare
        .to_openssh()
        .map_err(|e| KeyError::Malformed(e.to_string()))?;
    Ok(CheckedKey {
        fingerprint: key.fingerprint(HashAlg::Sha256).to_string(),
        comment: key.comment().as_str_lossy().trim().to_owned(),
        openssh: openssh.trim().to_owned(),
        algorithm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../tests/fixtures/ssh/", $name, ".pub"))
        };
    }

    /// What `ssh-keygen -lf` printed for each fixture: "BITS SHA256:... COMMENT (TYPE)".
    fn ssh_keygen_fingerprint(comment: &str) -> &'static str {
        include_str!("../tests/fixtures/ssh/ssh-keygen-lf.txt")
            .lines()
            .find(|l| l.contains(&format!(" {comment} ")))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_default()
    }

    #[test]
    fn accepted_keys_have_the_fingerprints_ssh_keygen_prints() {
        for (text, comment, algorithm) in [
            (fixture!("ed25519"), "test@ed25519", "ssh-ed25519"),
            (
                fixture!("ecdsab256"),
                "test@ecdsab256",
                "ecdsa-sha2-nistp256",
            ),
            (
                fixture!("ecdsab384"),
                "test@ecdsab384",
                "ecdsa-sha2-nistp384",
            ),
            (
                fixture!("ecdsab521"),
                "test@ecdsab521",
                "ecdsa-sha2-nistp521",
            ),
            (fixture!("rsab3072"), "test@rsab3072", "ssh-rsa"),
        ] {
            let key = check(text).unwrap_or_else(|e| panic!("{comment}: {e}"));
            assert_eq!(
                key.fingerprint,
                ssh_keygen_fingerprint(comment),
                "{comment}"
            );
            assert!(key.fingerprint.starts_with("SHA256:"), "{comment}");
            assert_eq!(key.algorithm, algorithm);
            assert_eq!(key.comment, comment);
            assert!(!key.openssh.contains(comment), "{}", key.openssh);
            // The stored form is itself a key with the same fingerprint.
            assert_eq!(
                check(&key.openssh).map(|k| k.fingerprint),
                Ok(key.fingerprint)
            );
        }
    }

    #[test]
    fn refused_keys_say_why() {
        assert_eq!(
            check(fixture!("rsab2048")),
            Err(KeyError::RsaTooShort(2048))
        );
        assert!(matches!(
            check(fixture!("dsa")),
            Err(KeyError::Unsupported(a)) if a == "ssh-dss"
        ));
        let two = format!("{}{}", fixture!("ed25519"), fixture!("ecdsab256"));
        assert_eq!(check(&two), Err(KeyError::NotOneLine));
        assert_eq!(check("  \n"), Err(KeyError::NotOneLine));
        assert!(matches!(
            check("ssh-ed25519 AAAAnotbase64!!"),
            Err(KeyError::Malformed(_))
        ));
        assert!(matches!(
            check("-----BEGIN OPENSSH PRIVATE KEY-----"),
            Err(KeyError::Malformed(_))
        ));
        // A valid key whose type field lies about its blob.
        let lying = fixture!("ed25519").replacen("ssh-ed25519", "ssh-rsa", 1);
        assert!(matches!(check(&lying), Err(KeyError::Malformed(_))));
        assert_eq!(check(&"A".repeat(20_000)), Err(KeyError::TooLong));
        for e in [KeyError::RsaTooShort(2048), KeyError::NotOneLine] {
            assert!(e.to_string().starts_with("public_key:"), "{e}");
        }
    }
}
