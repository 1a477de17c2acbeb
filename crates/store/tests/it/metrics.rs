//! The figures of `/metrics` as the store reads them: GPUs allocated and free, the queue,
//! reservations by status, nodes by status, and the money charged.

use chrono::Duration;
use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, GpuCounts, NewReservation, Scope};
use gpurent_types::agent::{InstanceState, SyncRequest};
use gpurent_types::Tier;

use crate::support::{self, one_gpu, t0, Fixture};

fn request(tenant: &str, queue: bool) -> NewReservation {
    NewReservation {
        queue,
        ..one_gpu(tenant)
    }
}

fn report(id: &str, state: InstanceState) -> SyncRequest {
    support::report(id, 1, state, None)
}

async fn metrics_follow_reservations(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 2).await;
    let alice = f.user("alice", "100").await;
    let prices = PriceList::defaults();
    let empty = f.store.metrics_view(t0()).await.expect("view");
    let model = empty.gpus.keys().next().expect("a model").clone();
    assert_eq!(
        empty.gpus[&model],
        GpuCounts {
            free: 2,
            allocated: 0,
            vram_mb: 2 * 24_576,
            free_mb: 2 * 24_576
        }
    );
    assert_eq!(empty.nodes.get("ready"), Some(&1));
    assert!(empty.queued.is_empty() && empty.reservations.is_empty());
    assert_eq!(empty.spot.success_rate, None);
    assert_eq!(empty.charged.to_string(), "0.00");

    let (first, _) = f
        .store
        .reserve(request(&alice, false), &prices, t0(), t0(), &[])
        .await
        .expect("reserve");
    f.store
        .reserve(request(&alice, false), &prices, t0(), t0(), &[])
        .await
        .expect("reserve");
    f.store
        .reserve(request(&alice, true), &prices, t0(), t0(), &[])
        .await
        .expect("queue");
    let busy = f.store.metrics_view(t0()).await.expect("view");
    assert_eq!(
        (busy.gpus[&model].free, busy.gpus[&model].allocated),
        (0, 2)
    );
    assert_eq!(busy.gpus[&model].free_mb, 0);
    let (queued, oldest) = busy.queued.values().next().expect("a queue");
    assert_eq!((*queued, *oldest), (1, Some(t0())));
    let on_demand = Tier::OnDemand.as_str().to_owned();
    assert_eq!(
        busy.reservations
            .get(&("pending".to_owned(), on_demand.clone())),
        Some(&3)
    );

    // The first runs 10 s and stops: 10 s of 2.50/h charged, 80% of it earned by the host.
    f.store
        .sync_node(&node, &report(&first.id, InstanceState::Running), t0())
        .await
        .expect("sync");
    let stop_at = t0() + Duration::seconds(10);
    f.store
        .request_stop(&first.id, &Scope::All, stop_at)
        .await
        .expect("stop");
    f.store
        .sync_node(&node, &report(&first.id, InstanceState::Stopped), stop_at)
        .await
        .expect("sync");
    let after = f.store.metrics_view(t0()).await.expect("view");
    assert_eq!(after.charged.to_string(), "0.006944");
    assert_eq!(after.host_earnings.to_string(), "0.005555");
    assert_eq!(
        after.reservations.get(&("stopped".to_owned(), on_demand)),
        Some(&1)
    );
    assert_eq!(after.gpus[&model].allocated, 1);
    assert_eq!(after.preempted, 0);

    // Past the node TTL the node is unreachable and its GPUs are no longer counted.
    let later = f
        .store
        .metrics_view(t0() + Duration::hours(1))
        .await
        .expect("view");
    assert_eq!(later.nodes.get("unreachable"), Some(&1));
    assert!(later.gpus.is_empty());
}

#[tokio::test]
async fn metrics_follow_reservations_sqlite() {
    metrics_follow_reservations(Backend::Sqlite).await;
}

#[tokio::test]
async fn metrics_follow_reservations_postgres() {
    metrics_follow_reservations(Backend::Postgres).await;
}
