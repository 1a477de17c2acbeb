//! On PostgreSQL the reservation writer keeps its own connection between batches
//! (`store/src/sql/held.rs`): one the server ended meanwhile (a restart, an administrator) is
//! replaced at the next batch without failing it, and closing the store closes it.

use std::time::Duration;

use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::Backend;
use sqlx::Connection;

use crate::support::{one_gpu, reservations_of, t0, Fixture};

/// Ends every other session on the fixture's database, waiting until each is gone; returns
/// how many there were.
async fn terminate_sessions(f: &Fixture) -> i64 {
    let mut conn = sqlx::PgConnection::connect(&f.url())
        .await
        .expect("connect");
    sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(&mut conn)
    .await
    .expect("terminate")
}

#[tokio::test]
async fn the_writers_connection_ended_by_the_server_is_replaced_at_the_next_batch() {
    let f = Fixture::new(Backend::Postgres).await;
    let tenant = f.user("ann", "100").await;
    f.node("n1", "NVIDIA GeForce RTX 4090", 4).await;
    let prices = PriceList::defaults();
    f.store
        .reserve(one_gpu(&tenant), &prices, t0(), t0(), &[])
        .await
        .expect("placed");

    // The writer's connection and the pool's are all ended between two batches.
    let ended = terminate_sessions(&f).await;
    assert!(ended >= 1, "the writer's connection was open: {ended}");
    for n in 2..=3 {
        f.store
            .reserve(one_gpu(&tenant), &prices, t0(), t0(), &[])
            .await
            .unwrap_or_else(|e| panic!("reservation {n} placed on a new connection: {e:?}"));
    }
    assert_eq!(reservations_of(&f, &tenant).await, 3);

    // The pool waits for every connection to come back before it closes: the writer's too.
    tokio::time::timeout(Duration::from_secs(60), f.store.close())
        .await
        .expect("the store closes with the writer's connection open");
}
