//! Tunnel holders in the store: a replica records the tunnel it holds, a newer holder
//! replaces it, a release by the old holder leaves the new one, and stale records are not
//! answered.

use chrono::Duration;
use gpurent_store::prelude::*;
use gpurent_store::Backend;

use crate::support::{t0, Fixture};

async fn holders_are_recorded_replaced_and_released(backend: Backend) {
    let f = Fixture::new(backend).await;
    let s = &f.store;
    assert_eq!(s.tunnel_holder("n1", t0()).await.unwrap(), None);
    s.hold_tunnel("n1", "http://a:1", "tok-a", t0())
        .await
        .unwrap();
    let held = s.tunnel_holder("n1", t0()).await.unwrap().unwrap();
    assert_eq!(
        (held.replica_url.as_str(), held.relay_token.as_str()),
        ("http://a:1", "tok-a")
    );
    // The agent reconnected to replica b; a's late release must not remove b's record.
    let later = t0() + Duration::seconds(5);
    s.hold_tunnel("n1", "http://b:2", "tok-b", later)
        .await
        .unwrap();
    s.release_tunnel("n1", "tok-a").await.unwrap();
    let held = s.tunnel_holder("n1", t0()).await.unwrap().unwrap();
    assert_eq!(held.replica_url, "http://b:2");
    assert_eq!(held.seen_at, later);
    // Not refreshed since: stale, not answered.
    assert_eq!(
        s.tunnel_holder("n1", later + Duration::seconds(1))
            .await
            .unwrap(),
        None
    );
    s.release_tunnel("n1", "tok-b").await.unwrap();
    assert_eq!(s.tunnel_holder("n1", t0()).await.unwrap(), None);
    f.store.close().await;
}

#[tokio::test]
async fn holders_are_recorded_replaced_and_released_sqlite() {
    holders_are_recorded_replaced_and_released(Backend::Sqlite).await;
}

#[tokio::test]
async fn holders_are_recorded_replaced_and_released_postgres() {
    holders_are_recorded_replaced_and_released(Backend::Postgres).await;
}
