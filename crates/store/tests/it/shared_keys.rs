//! Shared sealed keys: the first insert wins and every later one reads it back, also when
//! many replicas (separate stores on one database) insert at the same time.

use std::sync::Arc;

use gpurent_store::prelude::*;
use gpurent_store::{Backend, SqlStore};

use crate::support::{t0, Fixture};

async fn the_first_insert_wins(backend: Backend) {
    let f = Fixture::new(backend).await;
    assert_eq!(f.store.shared_key("node-ca").await.expect("read"), None);
    let kept = f
        .store
        .insert_shared_key("node-ca", "first", t0())
        .await
        .expect("insert");
    assert_eq!(kept, "first");
    let again = f
        .store
        .insert_shared_key("node-ca", "second", t0())
        .await
        .expect("insert again");
    assert_eq!(again, "first", "a later insert reads back the first");
    assert_eq!(
        f.store.shared_key("node-ca").await.expect("read"),
        Some("first".to_owned())
    );
    assert_eq!(f.store.shared_key("audit-key").await.expect("read"), None);

    // Eight replicas, each with its own pool, race for one name: all end with one value.
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(Arc::new(
            SqlStore::connect(&f.url()).await.expect("connect"),
        ));
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            let store = store.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .insert_shared_key("ssh-host-key", &format!("replica-{i}"), t0())
                    .await
                    .expect("racing insert")
            })
        })
        .collect();
    let mut kept = Vec::new();
    for task in tasks {
        kept.push(task.await.expect("task"));
    }
    let winner = kept[0].clone();
    assert!(winner.starts_with("replica-"), "{winner}");
    assert!(kept.iter().all(|k| *k == winner), "{kept:?}");
    assert_eq!(
        f.store.shared_key("ssh-host-key").await.expect("read"),
        Some(winner)
    );
    for store in stores {
        store.close().await;
    }
    f.store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_insert_wins_sqlite() {
    the_first_insert_wins(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_insert_wins_postgres() {
    the_first_insert_wins(Backend::Postgres).await;
}

/// Replicas started at once on a fresh PostgreSQL database all migrate it and start (SQLite
/// has one control plane per data dir: its lock refuses a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_at_once_on_a_fresh_database_all_start_postgres() {
    let db = gpurent_store::testing::TestDatabase::new(Backend::Postgres)
        .await
        .expect("test database");
    // Six connects in flight at once (sqlx's connect future is not Send: joined, not spawned).
    let connects = (0..6).map(|_| SqlStore::connect(&db.url));
    let stores: Vec<SqlStore> = futures_util::future::join_all(connects)
        .await
        .into_iter()
        .map(|store| store.expect("every replica connects"))
        .collect();
    let kept = stores[0]
        .insert_shared_key("node-ca", "one", t0())
        .await
        .expect("insert");
    assert_eq!(
        stores[5].shared_key("node-ca").await.expect("read"),
        Some(kept)
    );
    for store in stores {
        store.close().await;
    }
}
