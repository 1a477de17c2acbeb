//! `Idempotency-Key` for POSTs whose answer holds a secret (a user's token, a join token): the
//! first answer is kept sealed under a key derived from the Idempotency-Key, and replayed.

use std::future::Future;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpurent_store::{IdempotencyClaim, StoreError};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::extract::idempotency_key;
use crate::state::AppState;

/// How long a key is remembered: a retry a day later is a new request.
pub(crate) const KEEP_KEYS: chrono::Duration = chrono::Duration::hours(24);

const NONCE_BYTES: usize = 12;

/// What can go wrong keeping or replaying an answer; all of them are the server's fault.
#[derive(Debug, thiserror::Error)]
pub enum IdempotencyError {
    #[error("the stored answer is not a nonce and a ciphertext in hex")]
    Encoding,
    #[error("the answer could not be sealed")]
    Seal,
    #[error("the stored answer does not open under this Idempotency-Key")]
    Open,
    #[error("the stored answer has an invalid HTTP status {0}")]
    Status(u16),
    #[error("the answer could not be encoded")]
    Encode(#[source] serde_json::Error),
    #[error("the request's task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// The AES-256-GCM key that seals the answer to one Idempotency-Key of one caller on one route.
/// Only its hash and the sealed answer are stored, so the database alone cannot open it.
pub(crate) struct SealKey(Aes256Gcm);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    pub(crate) fn derive(scope: &str, idempotency_key: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"gpurent idempotency seal v1\0");
        h.update(scope.as_bytes());
        h.update(b"\0");
        h.update(idempotency_key.as_bytes());
        SealKey(Aes256Gcm::new(&h.finalize()))
    }

    /// Hex of a random nonce and the ciphertext; the status is authenticated with it.
    pub(crate) fn seal(&self, status: u16, body: &[u8]) -> Result<String, IdempotencyError> {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let aad = status.to_string();
        let ciphertext = self
            .0
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: body,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| IdempotencyError::Seal)?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&ciphertext);
        Ok(hex::encode(sealed))
    }

    pub(crate) fn open(&self, status: u16, sealed: &str) -> Result<Vec<u8>, IdempotencyError> {
        let bytes = hex::decode(sealed).map_err(|_| IdempotencyError::Encoding)?;
        if bytes.len() < NONCE_BYTES {
            return Err(IdempotencyError::Encoding);
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
        let nonce: [u8; NONCE_BYTES] = nonce.try_into().map_err(|_| IdempotencyError::Encoding)?;
        let aad = status.to_string();
        self.0
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| IdempotencyError::Open)
    }
}

/// An answer: made now, or the first answer to this Idempotency-Key (its exact JSON).
#[derive(Debug)]
pub(crate) enum Idempotent<T> {
    Fresh(StatusCode, T),
    Replay(StatusCode, Vec<u8>),
}

impl<T: Serialize> IntoResponse for Idempotent<T> {
    fn into_response(self) -> Response {
        match self {
            Idempotent::Fresh(status, body) => (status, Json(body)).into_response(),
            Idempotent::Replay(status, body) => {
                (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
        }
    }
}

/// Runs `op` once per `Idempotency-Key` of the caller on `route` (every time without a key).
/// With the same key and the same `request_hash`, a retry gets the first successful answer;
/// with another hash, 422; while the first still runs, 409. A failed `op` keeps nothing, so
/// its retry runs again.
///
/// With a key, the claim, `op` and the recording of its answer run in their own task: a client
/// that hangs up mid-request must not leave its key claimed with no answer.
pub(crate) async fn once<T, F>(
    state: &AppState,
    headers: &HeaderMap,
    route: &str,
    caller_id: &str,
    request_hash: String,
    op: F,
) -> Result<Idempotent<T>, ApiError>
where
    T: Serialize + Send + Sync + 'static,
    F: Future<Output = Result<(StatusCode, T), ApiError>> + Send + 'static,
{
    let Some(key) = idempotency_key(headers)? else {
        let (status, body) = op.await?;
        return Ok(Idempotent::Fresh(status, body));
    };
    let scope = format!("{route}:{caller_id}");
    let key_hash = hex::encode(Sha256::digest(key.as_bytes()));
    let seal_key = SealKey::derive(&scope, &key);
    let state = state.clone();
    let task = tokio::spawn(async move {
        let claim = state
            .store
            .begin_idempotent(&scope, &key_hash, &request_hash, state.now())
            .await?;
        match claim {
            IdempotencyClaim::Fresh => {}
            IdempotencyClaim::Replay {
                status,
                sealed_response,
            } => {
                let body = seal_key.open(status, &sealed_response)?;
                let status =
                    StatusCode::from_u16(status).map_err(|_| IdempotencyError::Status(status))?;
                return Ok(Idempotent::Replay(status, body));
            }
            IdempotencyClaim::InProgress => {
                return Err(StoreError::Conflict(
                    "a request with this Idempotency-Key is still in progress".into(),
                )
                .into())
            }
            IdempotencyClaim::Mismatch => return Err(StoreError::IdempotencyMismatch.into()),
        }
        match op.await {
            Ok((status, body)) => {
                if let Err(e) = record(&state, &scope, &key_hash, &seal_key, status, &body).await {
                    // The work is done and the caller gets its answer; a retry will run again.
                    tracing::error!(error = ?e, route = %scope, "could not keep an idempotent answer");
                    if let Err(e) = state.store.abort_idempotent(&scope, &key_hash).await {
                        tracing::error!(error = ?e, "could not release an Idempotency-Key");
                    }
                }
                Ok(Idempotent::Fresh(status, body))
            }
            Err(e) => {
                state.store.abort_idempotent(&scope, &key_hash).await?;
                Err(e)
            }
        }
    });
    task.await.map_err(IdempotencyError::Task)?
}

async fn record<T: Serialize>(
    state: &AppState,
    scope: &str,
    key_hash: &str,
    seal_key: &SealKey,
    status: StatusCode,
    body: &T,
) -> Result<(), ApiError> {
    let sealed = serde_json::to_vec(body)
        .map_err(IdempotencyError::Encode)
        .and_then(|json| seal_key.seal(status.as_u16(), &json))?;
    state
        .store
        .finish_idempotent(scope, key_hash, status.as_u16(), &sealed)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_opens_with_its_key_only() {
        let key = SealKey::derive("users.create:admin", "key-1");
        let body = br#"{"token":"gpr_secret"}"#;
        let sealed = key.seal(201, body).unwrap_or_else(|e| panic!("{e}"));
        assert!(!sealed.contains("gpr_secret"));
        assert_eq!(key.open(201, &sealed).ok().as_deref(), Some(&body[..]));
        // Every seal has its own nonce.
        assert_ne!(key.seal(201, body).ok(), Some(sealed.clone()));

        let other_key = SealKey::derive("users.create:admin", "key-2");
        let other_caller = SealKey::derive("users.create:someone", "key-1");
        for wrong in [&other_key, &other_caller] {
            assert!(matches!(
                wrong.open(201, &sealed),
                Err(IdempotencyError::Open)
            ));
        }
        // The status is sealed with the body.
        assert!(matches!(
            key.open(200, &sealed),
            Err(IdempotencyError::Open)
        ));
        let mut tampered = sealed.clone();
        tampered.replace_range(30..32, if &sealed[30..32] == "00" { "01" } else { "00" });
        assert!(matches!(
            key.open(201, &tampered),
            Err(IdempotencyError::Open)
        ));
        assert!(matches!(
            key.open(201, "zz"),
            Err(IdempotencyError::Encoding)
        ));
        assert!(matches!(
            key.open(201, "00ff"),
            Err(IdempotencyError::Encoding)
        ));
    }
}
