//! The hourly telemetry rollup: each sync adds its samples to the hour's row of each GPU (a
//! lost GPU's sample is left out), added up in memory and written a minute at a time, before a
//! report reads them and when the store closes; the usage facts of a window read them back, and
//! old hours are pruned.

use chrono::Duration;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, SqlStore};
use gpurent_types::agent::{GpuSample, NodeTelemetry, SyncRequest};

use crate::support::{t0, Fixture};

fn sample(uuid: &str, util: u32, used_mb: u64, lost: bool) -> GpuSample {
    GpuSample {
        uuid: uuid.to_owned(),
        utilization_pct: util,
        memory_used_mb: used_mb,
        temperature_c: 40,
        power_mw: 100_000,
        ecc_uncorrected: 0,
        memory_total_mb: 24_576,
        xid_errors: vec![],
        lost,
        processes: vec![],
    }
}

fn sync(samples: Vec<GpuSample>) -> SyncRequest {
    SyncRequest {
        gpus: vec![],
        instances: vec![],
        known_version: None,
        wait_ms: None,
        telemetry: Some(NodeTelemetry {
            gpus: samples,
            ..NodeTelemetry::default()
        }),
        logs: vec![],
        host: None,
        events: Vec::new(),
        volumes: Vec::new(),
        volume_free_bytes: None,
        images: None,
    }
}

async fn syncs_roll_up_per_gpu_and_hour(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 2).await;
    let (g0, g1) = ("GPU-n1-0", "GPU-n1-1");
    let at = |minutes: i64| t0() + Duration::minutes(minutes);
    for (when, samples) in [
        (
            at(10),
            vec![sample(g0, 100, 20_000, false), sample(g1, 0, 0, false)],
        ),
        (
            at(50),
            vec![sample(g0, 50, 10_000, false), sample(g1, 0, 0, true)],
        ),
        (at(70), vec![sample(g0, 90, 1_000, false)]),
    ] {
        f.store
            .sync_node(&node, &sync(samples), when)
            .await
            .expect("sync");
    }
    let facts = f
        .store
        .usage_facts(t0(), t0() + Duration::days(1), true)
        .await
        .expect("facts");
    let rows: Vec<_> = facts
        .hours
        .iter()
        .map(|h| {
            (
                h.hour,
                h.gpu_uuid.as_str(),
                h.samples,
                h.util_sum,
                h.mem_used_mb_sum,
                h.mem_max_mb,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (t0(), g0, 2, 150, 30_000, 20_000),
            (t0(), g1, 1, 0, 0, 0), // its second sample was of a lost GPU
            (at(60), g0, 1, 90, 1_000, 1_000),
        ]
    );
    assert_eq!(facts.gpus.len(), 2);
    assert!(facts.reservations.is_empty());
    let without = f
        .store
        .usage_facts(t0(), t0() + Duration::days(1), false)
        .await
        .expect("facts");
    assert!(without.hours.is_empty());

    // Samples are added up in memory and written a minute at a time: the next write adds to
    // the rows written before, and closing the store writes what it holds.
    f.store
        .sync_node(&node, &sync(vec![sample(g0, 10, 3_000, false)]), at(75))
        .await
        .expect("sync");
    f.store.close().await;
    let store = SqlStore::connect(&f.url()).await.expect("reopen");
    let facts = store
        .usage_facts(t0(), t0() + Duration::days(1), true)
        .await
        .expect("facts");
    let later: Vec<_> = facts
        .hours
        .iter()
        .filter(|h| h.hour == at(60))
        .map(|h| (h.samples, h.util_sum, h.mem_used_mb_sum, h.mem_max_mb))
        .collect();
    assert_eq!(later, [(2, 100, 4_000, 3_000)]);

    // Pruning forgets the hours that started before the instant given.
    assert_eq!(store.prune_gpu_hours(t0()).await.expect("prune"), 0);
    assert_eq!(store.prune_gpu_hours(at(60)).await.expect("prune"), 2);
    let left = store
        .usage_facts(t0(), t0() + Duration::days(1), true)
        .await
        .expect("facts");
    assert_eq!(left.hours.len(), 1);
}

#[tokio::test]
async fn syncs_roll_up_per_gpu_and_hour_sqlite() {
    syncs_roll_up_per_gpu_and_hour(Backend::Sqlite).await;
}

#[tokio::test]
async fn syncs_roll_up_per_gpu_and_hour_postgres() {
    syncs_roll_up_per_gpu_and_hour(Backend::Postgres).await;
}
