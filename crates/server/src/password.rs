//! Console passwords: argon2id with OWASP's parameters (19 MiB, 2 passes, 1 lane), and a
//! verification that takes the same time whether or not the user exists.

use std::sync::LazyLock;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    // password_hash's error is not `std::error::Error` without its `std` feature.
    #[error("cannot hash the password: {0}")]
    Hash(argon2::password_hash::Error),
    #[error("the password hashing task failed")]
    Busy,
}

fn hasher() -> Argon2<'static> {
    // OWASP's first recommendation for argon2id: m = 19456 KiB, t = 2, p = 1.
    let params = Params::new(19_456, 2, 1, None).unwrap_or_default();
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// The PHC string of `password` under a fresh random salt.
pub fn hash(password: &str) -> Result<String, PasswordError> {
    let salt_bytes: [u8; 16] = rand::random();
    let salt = SaltString::encode_b64(&salt_bytes).map_err(PasswordError::Hash)?;
    hasher()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(PasswordError::Hash)
}

/// A hash no password matches, verified in place of a missing one so that an unknown user
/// or one without a password costs the same time as a wrong password.
static DUMMY: LazyLock<Option<String>> = LazyLock::new(|| hash("not a password of anyone").ok());

/// Whether `password` matches `stored` (a PHC string); with no stored hash the dummy is
/// verified and the answer is false.
pub fn verify(password: &str, stored: Option<&str>) -> bool {
    let (phc, real) = match stored {
        Some(s) => (s.to_owned(), true),
        None => (DUMMY.clone().unwrap_or_default(), false),
    };
    let Ok(parsed) = PasswordHash::new(&phc) else {
        return false;
    };
    let ok = hasher()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok();
    ok && real
}

/// At most this many hashes run at once: each holds 19 MiB and a core for tens of
/// milliseconds, so a flood of logins queues here instead of exhausting memory.
static HASHING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// `verify` off the async workers, at most `HASHING` at once.
pub async fn verify_blocking(password: String, stored: Option<String>) -> bool {
    let Ok(_permit) = HASHING.acquire().await else {
        return false;
    };
    tokio::task::spawn_blocking(move || verify(&password, stored.as_deref()))
        .await
        .unwrap_or(false)
}

/// `hash` off the async workers, at most `HASHING` at once.
pub async fn hash_blocking(password: String) -> Result<String, PasswordError> {
    let _permit = HASHING.acquire().await.map_err(|_| PasswordError::Busy)?;
    tokio::task::spawn_blocking(move || hash(&password))
        .await
        .map_err(|_| PasswordError::Busy)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_argon2id_with_owasp_parameters_and_verify() {
        let h = hash("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify("correct horse", Some(&h)));
        assert!(!verify("wrong horse", Some(&h)));
        assert!(!verify("not a password of anyone", None));
        assert_ne!(hash("correct horse").unwrap(), h, "salted");
    }
}
