//! A reservation's whole life, on both stores: placed, running, stopped, charged exactly once.

use chrono::Duration;
use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, NewReservation, Scope, StoreError, Want};
use gpurent_types::agent::{InstanceState, SyncRequest};
use gpurent_types::ReservationStatus;

use crate::support::{self, assert_send_sync, one_gpu, t0, Fixture};

fn request(tenant: &str, count: u32) -> NewReservation {
    NewReservation {
        want: Want::Whole { count },
        command: vec!["sleep".into(), "infinity".into()],
        ..one_gpu(tenant)
    }
}

fn report(id: &str, state: InstanceState) -> SyncRequest {
    support::report(id, 1, state, None)
}

async fn reserve_run_stop_charge(backend: Backend) {
    let f = Fixture::new(backend).await;
    assert_send_sync(&*f.store);
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 2).await;
    let alice = f.user("alice", "100").await;
    let prices = PriceList::defaults();

    let (r, woken) = f
        .store
        .reserve(request(&alice, 2), &prices, t0(), t0(), &[])
        .await
        .expect("reserve");
    assert_eq!(woken, vec![node.clone()]);
    assert_eq!(r.status, ReservationStatus::Pending);
    assert_eq!(r.price_per_hour.to_string(), "5.00");
    assert_eq!(r.gpus.len(), 2);
    let offers = f.store.offers(&prices, t0()).await.expect("offers");
    assert_eq!(offers[0].available, 0);

    let err = f
        .store
        .reserve(request(&alice, 1), &prices, t0(), t0(), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NoCapacity(_)), "{err:?}");

    let (_, assignments) = f.store.desired_state(&node).await.expect("desired");
    assert_eq!(assignments.len(), 1);
    assert!(assignments[0].run);

    f.store
        .sync_node(&node, &report(&r.id, InstanceState::Running), t0())
        .await
        .expect("sync");
    let stop_at = t0() + Duration::seconds(10);
    let (stopping, _) = f
        .store
        .request_stop(&r.id, &Scope::All, stop_at)
        .await
        .expect("stop");
    assert_eq!(stopping.status, ReservationStatus::Stopping);
    let (_, assignments) = f.store.desired_state(&node).await.expect("desired");
    assert!(!assignments[0].run);

    // The agent reports late and twice: billing still ends at the stop request, once.
    let late = stop_at + Duration::seconds(30);
    for _ in 0..2 {
        f.store
            .sync_node(&node, &report(&r.id, InstanceState::Stopped), late)
            .await
            .expect("sync");
    }
    let done = f
        .store
        .get_reservation(&r.id, &Scope::Tenant(alice.clone()))
        .await
        .expect("get");
    assert_eq!(done.status, ReservationStatus::Stopped);
    assert_eq!(done.charged.to_string(), "0.013888"); // 10 s of 5.00/h
    assert_eq!(
        f.store.balance(&alice).await.expect("balance").to_string(),
        "99.986112"
    );
    let check = f.store.ledger_check().await.expect("ledger");
    assert!(check.ok(), "{check:?}");
    assert!(f
        .store
        .allocation_problems()
        .await
        .expect("check")
        .is_empty());
    assert_eq!(
        f.store.offers(&prices, t0()).await.expect("offers")[0].available,
        2
    );

    // Another tenant cannot see it.
    let bob = f.user("bob", "1").await;
    let err = f
        .store
        .get_reservation(&r.id, &Scope::Tenant(bob))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }));
}

#[tokio::test]
async fn reserve_run_stop_charge_sqlite() {
    reserve_run_stop_charge(Backend::Sqlite).await;
}

#[tokio::test]
async fn reserve_run_stop_charge_postgres() {
    reserve_run_stop_charge(Backend::Postgres).await;
}
