//! The queue in the store: a queued reservation is kept (also across a reopened store), and a
//! placement committed from a stale view never double-books a GPU.

use gpurent_billing::PriceList;
use gpurent_sched::Plan;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, NewReservation, Scope, SqlStore};
use gpurent_types::agent::{InstanceState, SyncRequest};
use gpurent_types::ReservationStatus;

use crate::support::{one_gpu, report, t0, Fixture};

fn request(tenant: &str, queue: bool) -> NewReservation {
    NewReservation {
        queue,
        ..one_gpu(tenant)
    }
}

fn stopped(id: &str) -> SyncRequest {
    report(id, 1, InstanceState::Stopped, None)
}

async fn assert_consistent(store: &SqlStore) {
    let problems = store.allocation_problems().await.expect("check");
    assert!(problems.is_empty(), "{problems:?}");
    let ledger = store.ledger_check().await.expect("ledger");
    assert!(ledger.ok(), "{ledger:?}");
}

async fn stale_placements_never_double_book(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 1).await;
    let alice = f.user("alice", "100").await;
    let bob = f.user("bob", "100").await;
    let prices = PriceList::defaults();
    let (first, _) = f
        .store
        .reserve(request(&alice, false), &prices, t0(), t0(), &[])
        .await
        .expect("reserve");
    let (queued, woken) = f
        .store
        .reserve(request(&bob, true), &prices, t0(), t0(), &[])
        .await
        .expect("queue");
    assert!(woken.is_empty());
    assert_eq!(queued.status, ReservationStatus::Pending);
    assert_eq!((queued.node.as_deref(), queued.gpus.len()), (None, 0));
    assert!(queued.queue_reason.is_some());
    assert_eq!(queued.held.to_string(), "2.50");
    assert_consistent(&f.store).await;

    // The queue is in the database: a reopened store has it.
    f.store.close().await;
    let store = SqlStore::connect(&f._db.url).await.expect("reopen");
    let view = store.queue_view(t0(), t0()).await.expect("view");
    assert_eq!(view.queued.len(), 1);
    assert_eq!(view.queued[0].id, queued.id);
    assert_eq!(view.gpus.len(), 1);
    assert_eq!(view.gpus[0].gpu.free_mb, 0);
    assert_eq!(view.held.len(), 1);
    assert_eq!(view.held[0].id, first.id);
    let gpu = &view.gpus[0].gpu;
    let plan = Plan {
        node_id: node.clone(),
        gpus: vec![(gpu.uuid.clone(), gpu.vram_mb)],
        whole: true,
        victims: vec![],
    };

    // A pass that thought the GPU free loses the compare-and-set and changes nothing.
    assert_eq!(
        store
            .place_queued(&queued.id, &plan, &prices, t0())
            .await
            .expect("place"),
        None
    );
    let r = store
        .get_reservation(&queued.id, &Scope::All)
        .await
        .expect("get");
    assert_eq!(
        (r.status, r.node, r.waited_s),
        (ReservationStatus::Pending, None, None)
    );
    assert_consistent(&store).await;

    // Once the GPU is free the same placement commits, once.
    let later = t0() + chrono::Duration::seconds(42);
    store
        .request_stop(&first.id, &Scope::All, later)
        .await
        .expect("stop");
    store
        .sync_node(&node, &stopped(&first.id), later)
        .await
        .expect("sync");
    assert_eq!(
        store
            .place_queued(&queued.id, &plan, &prices, later)
            .await
            .expect("place"),
        Some(vec![node.clone()])
    );
    assert_eq!(
        store
            .place_queued(&queued.id, &plan, &prices, later)
            .await
            .expect("again"),
        None
    );
    let r = store
        .get_reservation(&queued.id, &Scope::All)
        .await
        .expect("get");
    assert_eq!(r.status, ReservationStatus::Pending);
    assert_eq!(r.node.as_deref(), Some("n1"));
    assert_eq!(r.gpus, vec![gpu.uuid.clone()]);
    assert_eq!(r.queue_reason, None);
    assert_eq!(r.waited_s, Some(42.0));
    let (_, assignments) = store.desired_state(&node).await.expect("desired");
    assert_eq!(assignments.len(), 1);
    assert_eq!(assignments[0].reservation_id, queued.id);
    assert!(store
        .queue_view(t0(), later)
        .await
        .expect("view")
        .queued
        .is_empty());
    assert_consistent(&store).await;
    store.close().await;
}

#[tokio::test]
async fn stale_placements_never_double_book_sqlite() {
    stale_placements_never_double_book(Backend::Sqlite).await;
}

#[tokio::test]
async fn stale_placements_never_double_book_postgres() {
    stale_placements_never_double_book(Backend::Postgres).await;
}
