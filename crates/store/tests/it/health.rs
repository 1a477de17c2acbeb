//! A node's health is written only when it changes: the same issues reported by every sync
//! begin no transaction and record no event; each change is one transaction and one event.
//! On SQLite and PostgreSQL.

use gpurent_store::prelude::*;
use gpurent_store::Backend;
use gpurent_types::agent::SyncRequest;
use gpurent_types::api::HealthIssue;

use crate::support::{t0, Fixture};

fn hot() -> Vec<HealthIssue> {
    vec![HealthIssue {
        gpu_uuid: "GPU-n-0".to_owned(),
        rule: "temperature".to_owned(),
        detail: "91 C, over 90 C".to_owned(),
    }]
}

async fn events(f: &Fixture) -> Vec<String> {
    f.store
        .events(0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

async fn unchanged_health_writes_nothing(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n", "NVIDIA GeForce RTX 4090", 1).await;
    let store = &f.store;
    let start = events(&f).await.len();

    // Healthy as registered: saying so again changes nothing.
    let before = store.transactions_begun();
    for _ in 0..10 {
        assert!(!store.record_health(&node, &[], t0()).await.unwrap());
    }
    assert_eq!(
        store.transactions_begun(),
        before,
        "a healthy node reported healthy began a transaction"
    );

    // A breach: one transaction, one event; the same breach again nothing.
    assert!(!store.record_health(&node, &hot(), t0()).await.unwrap());
    assert_eq!(store.transactions_begun(), before + 1);
    for _ in 0..10 {
        assert!(!store.record_health(&node, &hot(), t0()).await.unwrap());
    }
    assert_eq!(
        store.transactions_begun(),
        before + 1,
        "the same breach again began a transaction"
    );
    let nodes = store.list_nodes(t0(), None).await.unwrap();
    assert_eq!(nodes[0].status, "unhealthy");

    // Healthy again: said once (queued work may fit), then nothing.
    assert!(store.record_health(&node, &[], t0()).await.unwrap());
    for _ in 0..10 {
        assert!(!store.record_health(&node, &[], t0()).await.unwrap());
    }
    assert_eq!(store.transactions_begun(), before + 2);
    assert_eq!(
        events(&f).await[start..],
        ["node_unhealthy".to_owned(), "node_healthy".to_owned()]
    );

    // A sync with telemetry and its health check: the sync's own transaction, nothing more.
    let sync = SyncRequest {
        telemetry: Some(Default::default()),
        ..crate::support::report(
            "none",
            1,
            gpurent_types::agent::InstanceState::Running,
            None,
        )
    };
    let before = store.transactions_begun();
    for _ in 0..10 {
        store.sync_node(&node, &sync, t0()).await.unwrap();
        store.record_health(&node, &[], t0()).await.unwrap();
    }
    assert_eq!(store.transactions_begun(), before + 10);

    // Unknown nodes are still refused.
    assert!(store.record_health("nope", &hot(), t0()).await.is_err());
    store.close().await;
}

#[tokio::test]
async fn unchanged_health_writes_nothing_sqlite() {
    unchanged_health_writes_nothing(Backend::Sqlite).await;
}

#[tokio::test]
async fn unchanged_health_writes_nothing_postgres() {
    unchanged_health_writes_nothing(Backend::Postgres).await;
}
