//! The caches of valid credentials: of API tokens (`check_token`), where a revocation, a role
//! change or an expiry takes effect at once through the same store, and within the cache's
//! second through another store on the same database (a second control plane); and of node
//! credentials (`authenticate_node`, every agent sync), where a revocation takes effect at once
//! through the same store and within the cache's 5 s through another.

use std::time::{Duration, Instant};

use gpurent_store::prelude::*;
use gpurent_store::{Backend, NewToken, SqlStore, TokenCheck};
use gpurent_types::Role;

use crate::support::{t0, Fixture};

async fn valid(store: &SqlStore, hash: &str, now: chrono::DateTime<chrono::Utc>) -> (Role, String) {
    match store.check_token(hash, now).await.unwrap() {
        TokenCheck::Valid(user, token) => (user.role, token.id),
        other => panic!("token {hash} should be valid, is {other:?}"),
    }
}

async fn revocation_and_role_changes_take_effect(backend: Backend) {
    let f = Fixture::new(backend).await;
    let s = &f.store;
    let user = f.user("ann", "0").await;
    // Checked twice, so that the second answer may come from the cache.
    let (_, first) = valid(s, "hash-ann", t0()).await;
    assert_eq!(valid(s, "hash-ann", t0()).await.0, Role::Tenant);

    s.set_role(&user, Role::Host).await.unwrap();
    assert_eq!(
        valid(s, "hash-ann", t0()).await.0,
        Role::Host,
        "a role change is seen by the next request"
    );

    s.revoke_token(&first, None, t0()).await.unwrap();
    assert!(
        matches!(
            s.check_token("hash-ann", t0()).await.unwrap(),
            TokenCheck::Revoked(_)
        ),
        "a revoked token is refused by the next request"
    );

    // A token that expires: valid (and cached) before, expired after, without any write.
    s.create_token(
        NewToken {
            user_id: user.clone(),
            token_hash: "hash-short".into(),
            kind: "api",
            name: None,
            expires_at: Some(t0() + chrono::Duration::minutes(5)),
            parent_id: None,
            scopes: None,
            team_id: None,
        },
        t0(),
    )
    .await
    .unwrap();
    valid(s, "hash-short", t0()).await;
    valid(s, "hash-short", t0()).await;
    assert!(matches!(
        s.check_token("hash-short", t0() + chrono::Duration::minutes(5))
            .await
            .unwrap(),
        TokenCheck::Expired(_)
    ));
}

async fn another_stores_revocation_takes_effect(backend: Backend) {
    let f = Fixture::new(backend).await;
    let other = SqlStore::connect(&f.url()).await.unwrap();
    f.user("bob", "0").await;
    let (_, id) = valid(&f.store, "hash-bob", t0()).await;
    valid(&f.store, "hash-bob", t0()).await;

    other.revoke_token(&id, None, t0()).await.unwrap();
    // The other store cannot clear this one's cache: the revocation is seen once the cached
    // answer is older than its second.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f.store.check_token("hash-bob", t0()).await.unwrap() {
            TokenCheck::Revoked(_) => break,
            TokenCheck::Valid(..) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("the token revoked by another store is still {other:?}"),
        }
    }
    other.close().await;
}

#[tokio::test]
async fn revocation_and_role_changes_take_effect_sqlite() {
    revocation_and_role_changes_take_effect(Backend::Sqlite).await;
}

#[tokio::test]
async fn revocation_and_role_changes_take_effect_postgres() {
    revocation_and_role_changes_take_effect(Backend::Postgres).await;
}

#[tokio::test]
async fn another_stores_revocation_takes_effect_sqlite() {
    another_stores_revocation_takes_effect(Backend::Sqlite).await;
}

#[tokio::test]
async fn another_stores_revocation_takes_effect_postgres() {
    another_stores_revocation_takes_effect(Backend::Postgres).await;
}

async fn a_revoked_node_is_refused(backend: Backend) {
    let f = Fixture::new(backend).await;
    let other = SqlStore::connect(&f.url()).await.unwrap();
    let (a, b) = (
        f.node("a", "RTX4090", 1).await,
        f.node("b", "RTX4090", 1).await,
    );
    let node = |store: &SqlStore, hash: &'static str| {
        let store = store.clone();
        async move { store.authenticate_node(hash).await.unwrap() }
    };
    // Asked twice, so that the second answer may come from the cache.
    for _ in 0..2 {
        let (id, cert) = node(&f.store, "node-a").await.expect("a's credential");
        assert_eq!(id, a);
        assert!(!cert.revoked);
        assert!(node(&f.store, "node-unknown").await.is_none());
    }
    f.store.revoke_node(&a, t0()).await.unwrap();
    let (_, cert) = node(&f.store, "node-a").await.expect("still known");
    assert!(
        cert.revoked,
        "revoked through this store: refused at the next sync"
    );

    // Through another store: within its cache's TTL.
    node(&f.store, "node-b").await.expect("b's credential");
    other.revoke_node(&b, t0()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, cert) = node(&f.store, "node-b").await.expect("still known");
        if cert.revoked {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node revoked by another store is still accepted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    other.close().await;
}

#[tokio::test]
async fn a_revoked_node_is_refused_sqlite() {
    a_revoked_node_is_refused(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_revoked_node_is_refused_postgres() {
    a_revoked_node_is_refused(Backend::Postgres).await;
}
