//! What an idle node's sync costs the database, the most frequent request of a fleet (every
//! node, every heartbeat): its credential's check (remembered 5 s, so none after the first
//! here), the sync with telemetry and the answer's
//! desired state, counted in statements sent, and what the sync reads back in the same
//! statement (the version the long poll compares, the health the health check compares) is
//! what a separate read would say. The hourly rollup still gets every sample.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::Duration;
use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::Backend;
use gpurent_types::agent::{GpuSample, NodeTelemetry, SyncRequest};
use gpurent_types::api::HealthIssue;

use crate::support::{one_gpu, t0, Fixture, Statements};

/// Eight idle GPUs' samples, as a held sync of `bench fleet`'s agents sends them.
fn heartbeat(node: &str, known: i64) -> SyncRequest {
    let gpus = (0..8)
        .map(|i| GpuSample {
            uuid: format!("GPU-{node}-{i}"),
            utilization_pct: 0,
            memory_used_mb: 1,
            temperature_c: 34,
            power_mw: 21_000,
            ecc_uncorrected: 0,
            memory_total_mb: 24_576,
            xid_errors: vec![],
            lost: false,
            processes: vec![],
        })
        .collect();
    SyncRequest {
        gpus: vec![],
        instances: vec![],
        known_version: Some(known),
        wait_ms: Some(1500),
        telemetry: Some(NodeTelemetry {
            gpus,
            cpu_utilization_pct: Some(12),
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

fn hot(node: &str) -> Vec<HealthIssue> {
    vec![HealthIssue {
        gpu_uuid: format!("GPU-{node}-0"),
        rule: "temperature".to_owned(),
        detail: "91 C, over 90 C".to_owned(),
    }]
}

async fn an_idle_sync_takes_few_statements(backend: Backend, most: u64) {
    let counter = Arc::new(Statements(AtomicU64::new(0)));
    // Its own process under nextest: nothing else sends queries here meanwhile.
    tracing::subscriber::set_global_default(Arc::clone(&counter)).expect("subscriber");
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 8).await;
    let store = &f.store;
    let version = store.desired_state(&node).await.expect("desired state").0;
    let mut counts = Vec::new();
    // The first warms what is prepared once per connection.
    for i in 0..5 {
        let before = counter.0.load(Ordering::SeqCst);
        let (id, cert) = store
            .authenticate_node("node-n1")
            .await
            .expect("authenticate")
            .expect("a known credential");
        assert_eq!(id, node);
        assert!(!cert.revoked);
        let synced = store
            .sync_node(
                &node,
                &heartbeat("n1", version),
                t0() + Duration::seconds(i),
            )
            .await
            .expect("sync");
        assert_eq!(
            synced.desired_version, version,
            "an idle sync changed nothing"
        );
        assert!(synced.health_is(&[]), "a healthy node's sync says so");
        // The answer, as the sync route takes it: what the sync read beside its write, else
        // read now.
        let answer = match synced.desired_state.clone() {
            Some(state) => state,
            None => store.desired_state(&node).await.expect("desired state"),
        };
        if i > 0 {
            counts.push(counter.0.load(Ordering::SeqCst) - before);
        }
        assert_eq!(answer, (version, vec![]));
        assert_eq!(
            answer,
            store.desired_state(&node).await.expect("desired state"),
            "the answer is the desired state as it is"
        );
    }
    eprintln!("statements per idle sync on {backend:?}: {counts:?}");
    assert!(counts.iter().all(|&c| c > 0), "nothing counted: {counts:?}");
    assert!(
        counts.iter().all(|&c| c <= most),
        "an idle node's sync sent {counts:?} statements; at most {most} expected"
    );

    // Every sample reached the hour's rollup (5 syncs).
    let facts = store
        .usage_facts(t0(), t0() + Duration::days(1), true)
        .await
        .expect("facts");
    assert_eq!(facts.hours.len(), 8, "{:?}", facts.hours);
    assert!(
        facts
            .hours
            .iter()
            .all(|h| (h.samples, h.util_sum, h.mem_used_mb_sum) == (5, 0, 5)),
        "{:?}",
        facts.hours
    );

    // What the sync reads back follows what changed: the health recorded, the version a
    // placement on the node bumped.
    let alice = f.user("alice", "1000").await;
    store
        .reserve(one_gpu(&alice), &PriceList::defaults(), t0(), t0(), &[])
        .await
        .expect("reserve");
    assert!(!store
        .record_health(&node, &hot("n1"), t0())
        .await
        .expect("health"));
    let synced = store
        .sync_node(
            &node,
            &heartbeat("n1", version),
            t0() + Duration::seconds(9),
        )
        .await
        .expect("sync");
    assert!(synced.health_is(&hot("n1")), "{synced:?}");
    assert!(!synced.health_is(&[]), "{synced:?}");
    let (now, assignments) = store.desired_state(&node).await.expect("desired state");
    assert!(now > version, "a placement bumps the version");
    assert_eq!((synced.desired_version, assignments.len()), (now, 1));
    if let Some(state) = &synced.desired_state {
        assert_eq!(state, &(now, assignments.clone()), "read beside the write");
    }
    assert_eq!(
        store.desired_version(&node).await.expect("version"),
        synced.desired_version
    );

    // A revoked node's credential still authenticates it; the certificate says it is revoked.
    store.revoke_node(&node, t0()).await.expect("revoke");
    let (_, cert) = store
        .authenticate_node("node-n1")
        .await
        .expect("authenticate")
        .expect("known");
    assert!(cert.revoked);
    assert!(store
        .authenticate_node("node-nope")
        .await
        .expect("authenticate")
        .is_none());
}

#[tokio::test]
async fn an_idle_sync_takes_few_statements_sqlite() {
    an_idle_sync_takes_few_statements(Backend::Sqlite, 3).await;
}

#[tokio::test]
async fn an_idle_sync_takes_few_statements_postgres() {
    an_idle_sync_takes_few_statements(Backend::Postgres, 1).await;
}
