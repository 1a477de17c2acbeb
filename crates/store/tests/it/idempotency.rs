//! Idempotency keys in the store: claimed once, replayed, refused with another body, released
//! on failure, forgotten after pruning.

use chrono::Duration;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, IdempotencyClaim};

use crate::support::{t0, Fixture};

async fn keys_claim_replay_and_prune(backend: Backend) {
    let f = Fixture::new(backend).await;
    let s = &f.store;
    let (scope, key) = ("users.create:admin", "kh-1");
    let claim =
        |body: &'static str, scope: &'static str| s.begin_idempotent(scope, key, body, t0());

    assert_eq!(
        claim("body-a", scope).await.unwrap(),
        IdempotencyClaim::Fresh
    );
    assert_eq!(
        claim("body-a", scope).await.unwrap(),
        IdempotencyClaim::InProgress
    );
    assert_eq!(
        claim("body-b", scope).await.unwrap(),
        IdempotencyClaim::Mismatch
    );
    // Another caller's key of the same value is its own.
    assert_eq!(
        claim("body-b", "users.create:other").await.unwrap(),
        IdempotencyClaim::Fresh
    );

    s.finish_idempotent(scope, key, 201, "sealed")
        .await
        .unwrap();
    assert_eq!(
        claim("body-a", scope).await.unwrap(),
        IdempotencyClaim::Replay {
            status: 201,
            sealed_response: "sealed".to_owned()
        }
    );
    assert_eq!(
        claim("body-b", scope).await.unwrap(),
        IdempotencyClaim::Mismatch
    );
    // A finished answer is never aborted away.
    s.abort_idempotent(scope, key).await.unwrap();
    assert!(matches!(
        claim("body-a", scope).await.unwrap(),
        IdempotencyClaim::Replay { .. }
    ));

    // A failed request releases its key: the retry runs again.
    let failed = "nodes.join_token:admin";
    assert_eq!(claim("{}", failed).await.unwrap(), IdempotencyClaim::Fresh);
    s.abort_idempotent(failed, key).await.unwrap();
    assert_eq!(claim("{}", failed).await.unwrap(), IdempotencyClaim::Fresh);

    // After a day the keys are forgotten.
    assert_eq!(s.prune_idempotency_keys(t0()).await.unwrap(), 0);
    assert_eq!(
        s.prune_idempotency_keys(t0() + Duration::hours(24))
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        claim("body-b", scope).await.unwrap(),
        IdempotencyClaim::Fresh
    );
}

#[tokio::test]
async fn keys_claim_replay_and_prune_sqlite() {
    keys_claim_replay_and_prune(Backend::Sqlite).await;
}

#[tokio::test]
async fn keys_claim_replay_and_prune_postgres() {
    keys_claim_replay_and_prune(Backend::Postgres).await;
}
