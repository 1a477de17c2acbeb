//! Two control-plane replicas settling the same period at once charge it once.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::Duration;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, SqlStore};
use gpurent_types::Money;

use crate::support::{t0, Fixture};

async fn two_replicas_settle_once(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n", "NVIDIA GeForce RTX 4090", 1).await;
    let tenant = f.user("many", "100000").await;
    f.store
        .seed_running_reservations(&tenant, &node, 500, Money::from_micros(2_500_000), t0())
        .await
        .unwrap();
    // A second replica: its own pool on the same database.
    let other = Arc::new(SqlStore::connect(&f._db.url).await.unwrap());
    let now = t0() + Duration::seconds(61);
    let period = StdDuration::from_secs(60);
    let (a, b) = tokio::join!(
        f.store.settle_due(now, period),
        other.settle_due(now, period)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        a.reservations + b.reservations,
        500,
        "every reservation settled by exactly one replica"
    );
    // And again, later, by both: the next period once.
    let later = now + Duration::seconds(60);
    let (c, d) = tokio::join!(
        f.store.settle_due(later, period),
        other.settle_due(later, period)
    );
    assert_eq!(c.unwrap().reservations + d.unwrap().reservations, 500);
    // 121 s at 2.50/h each, charged once.
    let balance = f.store.balance(&tenant).await.unwrap();
    assert_eq!(
        Money::units(100_000).checked_sub(balance),
        Some(Money::from_micros(84_027 * 500))
    );
    let ledger = f.store.ledger_check().await.unwrap();
    assert!(ledger.ok(), "{ledger:?}");
    other.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_settle_once_on_postgres() {
    two_replicas_settle_once(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_settle_once_on_sqlite() {
    two_replicas_settle_once(Backend::Sqlite).await;
}
