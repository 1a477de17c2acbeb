//! The store follows a PostgreSQL failover (issue 19): given both hosts of a primary and its
//! streaming standby, it writes to the primary whatever the order, and after the primary is
//! lost (killed, or demoted to read-only while still answering) and the standby promoted, it
//! writes there, with what was committed before still there.

use std::time::{Duration, Instant};

use chrono::Utc;
use gpurent_store::prelude::*;
use gpurent_store::{NewUser, SqlStore, StoreError};
use gpurent_types::{Money, Role};

use crate::pg_cluster::Cluster;

fn user(name: &str) -> NewUser {
    NewUser {
        name: name.to_owned(),
        role: Role::Tenant,
        token_hash: format!("hash-{name}"),
        credit: Money::ZERO,
    }
}

/// A primary, its standby, and a store given the standby's host first.
async fn pair() -> (Cluster, Cluster, SqlStore) {
    if std::env::var(gpurent_store::testing::PG_URL_VAR).is_err() {
        panic!("run with scripts/test.sh (PostgreSQL's binaries and the test database)");
    }
    let primary = Cluster::primary().await;
    let standby = Cluster::standby_of(&primary);
    let url = format!(
        "postgres://gpurent@127.0.0.1:{},127.0.0.1:{}/gpurent?target_session_attrs=read-write",
        standby.port, primary.port
    );
    let store = SqlStore::connect(&url).await.expect("connect to the pair");
    assert_eq!(
        store.database_host().as_deref(),
        Some(format!("127.0.0.1:{}", primary.port).as_str()),
        "the store must pick the writable host, not the first one listed"
    );
    (primary, standby, store)
}

/// Waits until the standby has replayed `name` (replication is asynchronous here, and a
/// fresh standby may not even have the tables yet).
async fn replicated(standby: &Cluster, name: &str) {
    let mut conn = standby.connect("gpurent").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counted: Result<i64, sqlx::Error> =
            sqlx::query_scalar("SELECT count(*) FROM users WHERE name = $1")
                .bind(name)
                .fetch_one(&mut conn)
                .await;
        match counted {
            Ok(1) => return,
            Ok(_) => {}
            // The migrations themselves may not have been replayed yet: no table is "not yet".
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {}
            Err(e) => panic!("count on the standby: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached the standby"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates `name` once the store follows, within a deadline; the errors met on the way must
/// be the retryable kind (503s for the client), never a wrong answer.
async fn create_eventually(store: &SqlStore, name: &str) -> Duration {
    let start = Instant::now();
    loop {
        match store.create_user(user(name), Utc::now()).await {
            Ok(_) => return start.elapsed(),
            Err(e) => {
                assert!(
                    e.is_unavailable() || e.is_overloaded(),
                    "a failover must fail as unavailable (retryable), got {e:?}"
                );
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "the store did not follow the failover: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn names(store: &SqlStore) -> Vec<String> {
    let mut names: Vec<String> = store
        .list_users(100, None)
        .await
        .expect("list users")
        .into_iter()
        .map(|u| u.name)
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn the_store_follows_a_killed_primary_to_the_promoted_standby() {
    let (mut primary, standby, store) = pair().await;
    store.ping().await.expect("ready on the primary");
    store
        .create_user(user("before"), Utc::now())
        .await
        .expect("write on the primary");
    replicated(&standby, "before").await;

    primary.kill();
    standby.promote();
    let took = create_eventually(&store, "after").await;
    println!("writes resumed {took:?} after the promotion");

    assert_eq!(
        store.database_host().as_deref(),
        Some(format!("127.0.0.1:{}", standby.port).as_str())
    );
    assert_eq!(names(&store).await, vec!["after", "before"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.ping().await.is_err() {
        assert!(Instant::now() < deadline, "never ready on the new primary");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_store_leaves_a_primary_turned_read_only_for_the_promoted_standby() {
    let (primary, standby, store) = pair().await;
    store
        .create_user(user("before"), Utc::now())
        .await
        .expect("write on the primary");
    replicated(&standby, "before").await;

    // Demoted but still answering: the pool's open connections stay up, read-only.
    let mut admin = primary.connect("gpurent").await;
    for sql in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::query(sql).execute(&mut admin).await.expect(sql);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match store.ping().await {
            Err(StoreError::Unavailable(why)) => {
                assert!(why.contains("read-only"), "{why}");
                break;
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "still ready on a read-only primary: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let refused = store.create_user(user("refused"), Utc::now()).await;
    assert!(
        matches!(&refused, Err(e) if e.is_unavailable()),
        "a write with no writable host must be refused as unavailable: {refused:?}"
    );

    standby.promote();
    create_eventually(&store, "after").await;
    assert_eq!(
        store.database_host().as_deref(),
        Some(format!("127.0.0.1:{}", standby.port).as_str())
    );
    // Written on the promoted standby, not on the old primary.
    let mut on_new = standby.connect("gpurent").await;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE name IN ('before', 'after')")
        .fetch_one(&mut on_new)
        .await
        .expect("count");
    assert_eq!(n, 2);
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM users WHERE name IN ('after', 'refused')")
            .fetch_one(&mut admin)
            .await
            .expect("count");
    assert_eq!(n, 0, "nothing may land on the read-only old primary");
}
