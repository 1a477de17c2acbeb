//! Node certificates in the store: the SHA-256 signed at registration, and revocation by id
//! or name (idempotent; an unknown node is not found).

use gpurent_store::prelude::*;
use gpurent_store::{Backend, NodeCertificate, StoreError};

use crate::support::{t0, Fixture};

async fn certificates_are_kept_and_revoked(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 1).await;
    let none = f.store.node_certificate(&node).await.expect("read");
    assert_eq!(
        none,
        NodeCertificate {
            sha256: None,
            revoked: false
        }
    );
    let sha = "ab".repeat(32);
    f.store
        .set_node_certificate(&node, &sha)
        .await
        .expect("set");
    assert_eq!(
        f.store.node_certificate(&node).await.expect("read").sha256,
        Some(sha)
    );
    // By name, then by id again: the same node, still revoked.
    assert_eq!(f.store.revoke_node("n1", t0()).await.expect("revoke"), node);
    assert_eq!(f.store.revoke_node(&node, t0()).await.expect("again"), node);
    assert!(f.store.node_certificate(&node).await.expect("read").revoked);
    assert!(matches!(
        f.store.revoke_node("nowhere", t0()).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        f.store.node_certificate("nowhere").await,
        Err(StoreError::NotFound { .. })
    ));
    f.store.close().await;
}

#[tokio::test]
async fn certificates_are_kept_and_revoked_sqlite() {
    certificates_are_kept_and_revoked(Backend::Sqlite).await;
}

#[tokio::test]
async fn certificates_are_kept_and_revoked_postgres() {
    certificates_are_kept_and_revoked(Backend::Postgres).await;
}
