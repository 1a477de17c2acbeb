//! Fencing lost nodes in the store: billing stops at the fence time, the reservation is queued
//! again with the next epoch, its GPU memory is free, and the node's later reports of the old
//! copy change nothing.

use std::time::Duration;

use gpurent_billing::{PriceList, Rate};
use gpurent_sched::Plan;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, Scope, SqlStore};
use gpurent_types::agent::{InstanceState, SyncRequest};
use gpurent_types::{Money, ReservationStatus};

use crate::support::{self, one_gpu, t0, Fixture};

const TTL: Duration = Duration::from_secs(6);

fn report(id: &str, epoch: i64, state: InstanceState) -> SyncRequest {
    support::report(id, epoch, state, None)
}

async fn assert_consistent(store: &SqlStore) {
    let problems = store.allocation_problems().await.expect("check");
    assert!(problems.is_empty(), "{problems:?}");
    let ledger = store.ledger_check().await.expect("ledger");
    assert!(ledger.ok(), "{ledger:?}");
}

async fn a_lost_node_is_fenced_once(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 1).await;
    let alice = f.user("alice", "100").await;
    let prices = PriceList::defaults();
    let (r, _) = f
        .store
        .reserve(one_gpu(&alice), &prices, t0(), t0(), &[])
        .await
        .expect("reserve");
    f.store
        .sync_node(&node, &report(&r.id, 1, InstanceState::Running), t0())
        .await
        .expect("running");
    let seen = t0() + chrono::Duration::seconds(3);
    f.store
        .sync_node(&node, &report(&r.id, 1, InstanceState::Running), seen)
        .await
        .expect("heartbeat");

    // Within the TTL of its last heartbeat nothing happens.
    let fenced = f
        .store
        .fence_lost_nodes(TTL, seen + chrono::Duration::seconds(6))
        .await
        .expect("fence");
    assert!(fenced.nodes.is_empty(), "{fenced:?}");

    // Noticed long after: billed to the fence time (last heartbeat + TTL) only.
    let late = t0() + chrono::Duration::seconds(100);
    let fenced = f.store.fence_lost_nodes(TTL, late).await.expect("fence");
    assert_eq!(fenced.nodes, vec![node.clone()]);
    assert_eq!(fenced.rescheduled, vec![r.id.clone()]);
    let got = f
        .store
        .get_reservation(&r.id, &Scope::All)
        .await
        .expect("get");
    assert_eq!(got.status, ReservationStatus::Pending);
    assert_eq!(
        (got.node.as_deref(), got.gpus.len(), got.epoch),
        (None, 0, 2)
    );
    let rate = Rate::flat(r.price_per_hour);
    assert_eq!(got.charged, rate.charge_for_seconds(9));
    assert_eq!(got.held, "2.50".parse::<Money>().expect("money"));
    let nodes = f.store.list_nodes(late, None).await.expect("nodes");
    assert_eq!(nodes[0].status, "lost");
    assert!(nodes[0].gpus.iter().all(|g| g.status == "free"));
    assert_consistent(&f.store).await;

    // Fenced once: a second pass finds nothing to do.
    let again = f.store.fence_lost_nodes(TTL, late).await.expect("fence");
    assert!(again.nodes.is_empty() && again.rescheduled.is_empty());

    // A placement decided from a view older than the fencing lands on the lost node: the next
    // pass moves it off again, with the next epoch and nothing more charged.
    let gpu = nodes[0].gpus[0].uuid.clone();
    let placed = f
        .store
        .place_queued(
            &r.id,
            &Plan {
                node_id: node.clone(),
                gpus: vec![(gpu, 24_576)],
                whole: true,
                victims: vec![],
            },
            &prices,
            late,
        )
        .await
        .expect("place");
    assert!(placed.is_some());
    let again = f.store.fence_lost_nodes(TTL, late).await.expect("fence");
    assert_eq!(again.rescheduled, vec![r.id.clone()]);
    let got = f
        .store
        .get_reservation(&r.id, &Scope::All)
        .await
        .expect("get");
    assert_eq!((got.status, got.epoch), (ReservationStatus::Pending, 3));
    assert_eq!(got.charged, rate.charge_for_seconds(9));
    assert_consistent(&f.store).await;

    // The node comes back still reporting the old copy: ready again, told nothing of it, and
    // the report changes nothing.
    let back = late + chrono::Duration::seconds(1);
    f.store
        .sync_node(&node, &report(&r.id, 1, InstanceState::Running), back)
        .await
        .expect("back");
    let (_, desired) = f.store.desired_state(&node).await.expect("desired");
    assert!(desired.is_empty(), "{desired:?}");
    let nodes = f.store.list_nodes(back, None).await.expect("nodes");
    assert_eq!(nodes[0].status, "ready");
    let got = f
        .store
        .get_reservation(&r.id, &Scope::All)
        .await
        .expect("get");
    assert_eq!((got.status, got.epoch), (ReservationStatus::Pending, 3));
    assert_eq!(got.charged, rate.charge_for_seconds(9));
    assert_consistent(&f.store).await;
    f.store.close().await;
}

#[tokio::test]
async fn a_lost_node_is_fenced_once_sqlite() {
    a_lost_node_is_fenced_once(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_lost_node_is_fenced_once_postgres() {
    a_lost_node_is_fenced_once(Backend::Postgres).await;
}
