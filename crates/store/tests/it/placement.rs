//! Placement committed in one transaction, on both stores: a stale plan rolls back whole
//! (its victims are not preempted), concurrent reservations of one type take every GPU once
//! and are refused only when none is left, and a reservation costs a bounded number of
//! round trips.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gpurent_billing::PriceList;
use gpurent_sched::Plan;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, NewReservation, Scope, StoreError};
use gpurent_types::{Money, ReservationStatus, Tier};

use crate::support::{one_gpu, t0, Fixture, Statements};

async fn assert_consistent(f: &Fixture) {
    let problems = f.store.allocation_problems().await.expect("check");
    assert!(problems.is_empty(), "{problems:?}");
}

fn spot(tenant: &str) -> NewReservation {
    NewReservation {
        tier: Tier::Spot,
        bid: Some("1.20".parse::<Money>().expect("bid")),
        ..one_gpu(tenant)
    }
}

async fn a_stale_plan_rolls_back_whole(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 2).await;
    let alice = f.user("alice", "100").await;
    let prices = PriceList::defaults();
    let (cheap, _) = f
        .store
        .reserve(spot(&alice), &prices, t0(), t0(), &[])
        .await
        .expect("spot");
    let (busy, _) = f
        .store
        .reserve(one_gpu(&alice), &prices, t0(), t0(), &[])
        .await
        .expect("on demand");
    let (queued, _) = f
        .store
        .reserve(
            // A bid no higher than the spot instance's preempts nothing: it waits.
            NewReservation {
                queue: true,
                ..spot(&alice)
            },
            &prices,
            t0(),
            t0(),
            &[],
        )
        .await
        .expect("queued");
    assert_eq!(queued.node, None);

    // A plan (as a pass could make from a stale view) that preempts the spot instance but
    // takes the GPU the on-demand one holds: its compare-and-set fails, and the preemption
    // goes with it.
    let plan = Plan {
        node_id: node.clone(),
        gpus: vec![(busy.gpus[0].clone(), 24_576)],
        whole: true,
        victims: vec![cheap.id.clone()],
    };
    let placed = f
        .store
        .place_queued(&queued.id, &plan, &prices, t0())
        .await
        .expect("place");
    assert_eq!(placed, None);
    let status = |id: String| {
        let store = Arc::clone(&f.store);
        async move { store.get_reservation(&id, &Scope::All).await.expect("get") }
    };
    let cheap_now = status(cheap.id.clone()).await;
    assert_eq!(
        (cheap_now.status, cheap_now.end_reason),
        (ReservationStatus::Pending, None)
    );
    assert_eq!(status(queued.id.clone()).await.node, None);
    assert_consistent(&f).await;

    // The same victim with its own GPU: it is preempted and the queued reservation placed.
    let plan = Plan {
        gpus: vec![(cheap.gpus[0].clone(), 24_576)],
        ..plan
    };
    let placed = f
        .store
        .place_queued(&queued.id, &plan, &prices, t0())
        .await
        .expect("place");
    assert_eq!(placed, Some(vec![node.clone()]));
    assert_eq!(
        status(cheap.id.clone()).await.end_reason.as_deref(),
        Some("preempted")
    );
    assert_eq!(status(queued.id.clone()).await.gpus, cheap.gpus);
    assert_consistent(&f).await;
}

#[tokio::test]
async fn a_stale_plan_rolls_back_whole_sqlite() {
    a_stale_plan_rolls_back_whole(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_stale_plan_rolls_back_whole_postgres() {
    a_stale_plan_rolls_back_whole(Backend::Postgres).await;
}

/// Six GPUs on three nodes, sixteen reservations at once: six placed, each on its own GPU,
/// and ten refused for want of capacity, none for losing a race.
async fn concurrent_reservations_take_every_gpu_once(backend: Backend) {
    let f = Fixture::new(backend).await;
    for n in ["n1", "n2", "n3"] {
        f.node(n, "NVIDIA GeForce RTX 4090", 2).await;
    }
    let alice = f.user("alice", "1000").await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (store, alice) = (Arc::clone(&f.store), alice.clone());
        tasks.push(tokio::spawn(async move {
            store
                .reserve(one_gpu(&alice), &PriceList::defaults(), t0(), t0(), &[])
                .await
        }));
    }
    let mut gpus = Vec::new();
    let mut refused = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok((r, _)) => gpus.extend(r.gpus),
            Err(StoreError::NoCapacity(_)) => refused += 1,
            Err(e) => panic!("refused for another reason: {e:?}"),
        }
    }
    gpus.sort();
    gpus.dedup();
    assert_eq!((gpus.len(), refused), (6, 10), "{gpus:?}");
    assert_consistent(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reservations_take_every_gpu_once_sqlite() {
    concurrent_reservations_take_every_gpu_once(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reservations_take_every_gpu_once_postgres() {
    concurrent_reservations_take_every_gpu_once(Backend::Postgres).await;
}

/// The queries a reservation like `bench reserve`'s sends (one whole GPU, on demand, with an
/// Idempotency-Key, no caps), as sqlx logs them: at most `most`.
async fn a_reservation_takes_few_round_trips(backend: Backend, most: u64) {
    let counter = Arc::new(Statements(AtomicU64::new(0)));
    // Its own process under nextest: nothing else sends queries here meanwhile.
    tracing::subscriber::set_global_default(Arc::clone(&counter)).expect("subscriber");
    let f = Fixture::new(backend).await;
    f.node("n1", "NVIDIA GeForce RTX 4090", 8).await;
    let alice = f.user("alice", "1000").await;
    let prices = PriceList::defaults();
    // The first one warms what is read once per connection.
    f.store
        .reserve(one_gpu(&alice), &prices, t0(), t0(), &[])
        .await
        .expect("reserve");
    let mut counts = Vec::new();
    for i in 0..4 {
        let before = counter.0.load(Ordering::SeqCst);
        let new = NewReservation {
            idempotency_key: Some(format!("key-{i}")),
            request_hash: format!("hash-{i}"),
            ..one_gpu(&alice)
        };
        f.store
            .reserve(new, &prices, t0(), t0(), &[])
            .await
            .expect("reserve");
        counts.push(counter.0.load(Ordering::SeqCst) - before);
    }
    eprintln!("queries per reservation on {backend:?}: {counts:?}");
    assert!(counts.iter().all(|&c| c > 0), "nothing counted: {counts:?}");
    assert!(
        counts.iter().all(|&c| c <= most),
        "a reservation sent {counts:?} queries; at most {most} expected"
    );
}

#[tokio::test]
async fn a_reservation_takes_few_round_trips_sqlite() {
    a_reservation_takes_few_round_trips(Backend::Sqlite, 2).await;
}

#[tokio::test]
async fn a_reservation_takes_few_round_trips_postgres() {
    a_reservation_takes_few_round_trips(Backend::Postgres, 6).await;
}

/// Requests that arrive together are written together, and decided as one at a time would
/// be: a burst of 24 from three tenants (one capped at 3 live reservations, one whose credit
/// covers 2 first hours, one repeating an Idempotency-Key) on 2 nodes of 8 GPUs. Every
/// refusal is the one-reservation path's, the GPUs are taken once each, the ledger balances,
/// and the burst takes far fewer transactions than requests.
async fn a_burst_is_written_together(backend: Backend) {
    let f = Fixture::new(backend).await;
    for n in ["n1", "n2"] {
        f.node(n, "NVIDIA GeForce RTX 4090", 8).await;
    }
    let capped = f.user("capped", "1000").await;
    // The default price of an RTX 4090 is 2.50 an hour, held for the first hour.
    let poor = f.user("poor", "5.50").await;
    let keyed = f.user("keyed", "1000").await;
    let mut asks = Vec::new();
    for i in 0..8 {
        asks.push(NewReservation {
            limits: gpurent_store::TenantLimits {
                max_reservations: 3,
                ..gpurent_store::TenantLimits::UNLIMITED
            },
            ..one_gpu(&capped)
        });
        asks.push(one_gpu(&poor));
        asks.push(NewReservation {
            // Two requests for each key.
            idempotency_key: Some(format!("key-{}", i / 2)),
            request_hash: format!("hash-{}", i / 2),
            ..one_gpu(&keyed)
        });
    }
    let begun = f.store.transactions_begun();
    let prices = PriceList::defaults();
    let answers = futures_util::future::join_all(
        asks.into_iter()
            .map(|new| f.store.reserve(new, &prices, t0(), t0(), &[])),
    )
    .await;
    let transactions = f.store.transactions_begun() - begun;
    let (mut placed, mut over_cap, mut no_credit) = (Vec::new(), 0, 0);
    let mut keyed_answers: std::collections::HashMap<String, Vec<String>> = Default::default();
    for answer in answers {
        match answer {
            Ok((r, _)) => {
                if r.tenant_id == keyed {
                    keyed_answers
                        .entry(r.id.clone())
                        .or_default()
                        .push(r.id.clone());
                }
                placed.push(r);
            }
            Err(StoreError::LimitExceeded(_)) => over_cap += 1,
            Err(StoreError::InsufficientCredit { .. }) => no_credit += 1,
            Err(e) => panic!("refused for another reason: {e:?}"),
        }
    }
    let count = |tenant: &str| placed.iter().filter(|r| r.tenant_id == tenant).count();
    assert_eq!((count(&capped), over_cap), (3, 5), "capped tenant");
    assert_eq!(
        (count(&poor), no_credit),
        (2, 6),
        "tenant with 5.50 of credit"
    );
    // Each key made one reservation, answered to both of its requests.
    assert_eq!(count(&keyed), 8);
    assert_eq!(keyed_answers.len(), 4, "{keyed_answers:?}");
    assert!(
        keyed_answers.values().all(|ids| ids.len() == 2),
        "{keyed_answers:?}"
    );
    let mut gpus: Vec<String> = placed
        .iter()
        .filter(|r| r.tenant_id != keyed)
        .flat_map(|r| r.gpus.clone())
        .collect();
    gpus.extend(keyed_answers.keys().filter_map(|id| {
        placed
            .iter()
            .find(|r| &r.id == id)
            .and_then(|r| r.gpus.first().cloned())
    }));
    let taken = gpus.len();
    gpus.sort();
    gpus.dedup();
    assert_eq!(gpus.len(), taken, "a GPU taken twice");
    assert_eq!(taken, 3 + 2 + 4);
    assert_consistent(&f).await;
    let ledger = f.store.ledger_check().await.expect("ledger");
    assert!(ledger.ok(), "{ledger:?}");
    assert_eq!(
        f.store.balance(&poor).await.expect("balance").to_string(),
        "0.50"
    );
    eprintln!("24 requests in {transactions} transactions on {backend:?}");
    assert!(
        transactions < 24,
        "{transactions} transactions for 24 requests: not written together"
    );

    // The keys again, in a burst of their own: each is a replay of what the first burst
    // committed (a batch counts the earlier requests with its keys, then reads which).
    let again = futures_util::future::join_all((0..8).map(|i| {
        let new = NewReservation {
            idempotency_key: Some(format!("key-{}", i / 2)),
            request_hash: format!("hash-{}", i / 2),
            ..one_gpu(&keyed)
        };
        f.store.reserve(new, &prices, t0(), t0(), &[])
    }))
    .await;
    let mut replayed: Vec<String> = again
        .into_iter()
        .map(|a| a.expect("a replay").0.id)
        .collect();
    replayed.sort();
    replayed.dedup();
    let mut first: Vec<String> = keyed_answers.keys().cloned().collect();
    first.sort();
    assert_eq!(replayed, first, "a key placed again");
    let ledger = f.store.ledger_check().await.expect("ledger");
    assert!(ledger.ok(), "{ledger:?}");
}

#[tokio::test]
async fn a_burst_is_written_together_sqlite() {
    a_burst_is_written_together(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_burst_is_written_together_postgres() {
    a_burst_is_written_together(Backend::Postgres).await;
}
