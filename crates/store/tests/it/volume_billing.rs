//! Volumes' charges on both stores: per GB-month of their size, per second, settled in
//! pieces that add up exactly to `gpurent_billing::storage_charge` of each stretch (a resize
//! starts another), idempotent, stopped at removal, the host paid its share of a local one,
//! each its own line in usage and statements, and the storage grace of an owner gone below
//! zero set and lifted.

use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use gpurent_billing::{storage_charge, BYTES_PER_GB};
use gpurent_store::prelude::*;
use gpurent_store::{Backend, NewVolume};
use gpurent_types::agent::VolumeFacts;
use gpurent_types::api::{VolumeKind, VolumeState};
use gpurent_types::Money;

use crate::support::{t0, Fixture};

/// Settled whenever asked a second or more after the last time.
const PERIOD: StdDuration = StdDuration::from_secs(1);

fn price() -> Money {
    Money::from_micros(70_000)
}

fn volume(owner: &str, name: &str, node: Option<&str>, gb: u64) -> NewVolume {
    NewVolume {
        owner_id: owner.to_owned(),
        name: name.to_owned(),
        kind: if node.is_some() {
            VolumeKind::Local
        } else {
            VolumeKind::Shared
        },
        node_id: node.map(str::to_owned),
        size_bytes: gb * BYTES_PER_GB,
        price_per_gb_month: price(),
        host_share_bps: 8_000,
    }
}

fn at(seconds: i64) -> DateTime<Utc> {
    t0() + Duration::seconds(seconds)
}

fn charge(gb: u64, seconds: i64) -> Money {
    storage_charge(
        price(),
        gb * BYTES_PER_GB,
        u64::try_from(seconds).expect("seconds"),
    )
}

fn add(a: Money, b: Money) -> Money {
    a.checked_add(b).expect("no overflow")
}

async fn volumes_are_charged_per_second_of_their_size(backend: Backend) {
    let f = Fixture::new(backend).await;
    let (node, host) = f.node_owned("box", "NVIDIA GeForce RTX 4090", 1).await;
    f.store
        .set_volume_facts(
            &node,
            Some(&VolumeFacts {
                enforcement: "loop".into(),
                reason: None,
                free_bytes: 10_000 * BYTES_PER_GB,
                shared: true,
            }),
        )
        .await
        .expect("facts");
    let ada = f.user("ada", "1000").await;
    let local = f
        .store
        .create_volume(volume(&ada, "data", Some(&node), 100), at(0))
        .await
        .expect("local volume");
    let shared = f
        .store
        .create_volume(volume(&ada, "sets", None, 7), at(0))
        .await
        .expect("shared volume");
    assert_eq!(local.price_per_gb_month, price());
    assert_eq!(local.charged, Money::ZERO);

    // Settled at odd times, some twice: what is due each time, exactly, never twice.
    let mut now = 0;
    for step in [61, 59, 3_599, 1, 86_401, 60, 7] {
        now += step;
        for _ in 0..2 {
            f.store
                .settle_volumes(at(now), PERIOD)
                .await
                .expect("settle");
        }
    }
    let got = f.store.volume(None, &local.id, at(now)).await.expect("get");
    assert_eq!(got.charged, charge(100, now), "local");
    let got = f
        .store
        .volume(None, &shared.id, at(now))
        .await
        .expect("get");
    assert_eq!(got.charged, charge(7, now), "shared");

    // Grown: the old size up to now, the new one after.
    let grown_at = now;
    let grown = f
        .store
        .resize_volume(
            None,
            &local.id,
            150 * BYTES_PER_GB,
            price(),
            at(now),
            at(grown_at),
        )
        .await
        .expect("resize");
    assert_eq!(grown.charged, charge(100, grown_at));
    now += 3 * 86_400 + 17;
    f.store
        .settle_volumes(at(now), PERIOD)
        .await
        .expect("settle");
    // Removed: charged up to then, and never again.
    let removed = f
        .store
        .remove_volume(None, &local.id, at(now), at(now + 30))
        .await
        .expect("remove");
    assert_eq!(removed.state, VolumeState::Deleting);
    let local_total = add(charge(100, grown_at), charge(150, now + 30 - grown_at));
    assert_eq!(removed.charged, local_total);
    f.store
        .settle_volumes(at(now + 86_400), PERIOD)
        .await
        .expect("settle");
    let got = f
        .store
        .list_volumes(Some(&ada), 10, None, at(now))
        .await
        .expect("list");
    let after = got.iter().find(|v| v.id == local.id).expect("listed");
    assert_eq!(after.charged, local_total, "not charged after its removal");
    let shared_total = charge(7, now + 86_400);
    let sets = got.iter().find(|v| v.id == shared.id).expect("listed");
    assert_eq!(sets.charged, shared_total);

    // The ledger: the tenant paid both, the host earned 80% of the local one only.
    let total = add(local_total, shared_total);
    assert_eq!(
        f.store.balance(&ada).await.expect("balance"),
        Money::units(1000).checked_sub(total).expect("no overflow")
    );
    let (_, _, earned) = f.store.accounts(&host).await.expect("accounts");
    assert_eq!(
        earned,
        Money::from_micros(local_total.micros() * 8_000 / 10_000)
    );
    let check = f.store.ledger_check().await.expect("ledger");
    assert!(check.ok(), "{check:?}");

    // Its own lines: usage per volume, the statement per volume, the host's per node.
    let usage = f
        .store
        .usage(&ada, at(0), at(now + 86_401))
        .await
        .expect("usage");
    assert_eq!(usage.total, total);
    assert!(usage.reservations.is_empty());
    let mut lines: Vec<(String, Money)> = usage
        .volumes
        .iter()
        .map(|v| (v.name.clone(), v.charged))
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![("data".into(), local_total), ("sets".into(), shared_total)]
    );
    let storage = f
        .store
        .storage_lines(&ada, at(0), at(now + 86_401))
        .await
        .expect("statement");
    assert_eq!(storage.len(), 2);
    assert_eq!(
        storage.iter().map(|l| l.amount.micros()).sum::<i64>(),
        total.micros()
    );
    let data = storage.iter().find(|l| l.name == "data").expect("line");
    assert_eq!(data.size_bytes, 150 * BYTES_PER_GB);
    assert!(data.deleted_at.is_some());
    assert!(f
        .store
        .invoice_lines(&ada, at(0), at(now + 86_401))
        .await
        .expect("invoice")
        .is_empty());
    let earnings = f
        .store
        .earnings(&host, at(0), at(now + 86_401))
        .await
        .expect("earnings");
    assert_eq!(earnings.len(), 1);
    assert_eq!(earnings[0].earned, earned);
}

async fn an_unpaid_owner_keeps_their_data_for_the_grace(backend: Backend) {
    let f = Fixture::new(backend).await;
    let bo = f.user("bo", "0.10").await;
    let v = f
        .store
        .create_volume(volume(&bo, "big", None, 1_000), at(0))
        .await
        .expect("volume");
    // 1000 GB at 0.07 is 70 a month, 0.0958 a hour: paid for about an hour.
    f.store
        .settle_volumes(at(1_800), PERIOD)
        .await
        .expect("settle");
    let got = f.store.volume(None, &v.id, at(0)).await.expect("get");
    assert_eq!(got.unpaid_since, None);
    f.store
        .settle_volumes(at(7_200), PERIOD)
        .await
        .expect("settle");
    let got = f.store.volume(None, &v.id, at(0)).await.expect("get");
    assert_eq!(got.unpaid_since, Some(at(7_200)), "unpaid from then");
    assert!(f.store.balance(&bo).await.expect("balance") < Money::ZERO);
    // Still charged, and the first time it went unpaid is kept.
    f.store
        .settle_volumes(at(10_800), PERIOD)
        .await
        .expect("settle");
    let got = f.store.volume(None, &v.id, at(0)).await.expect("get");
    assert_eq!(got.unpaid_since, Some(at(7_200)));
    assert_eq!(got.charged, charge(1_000, 10_800));
    // Paid again: no longer unpaid at the next settlement.
    f.store
        .grant_credit(&bo, Money::units(50), "grant-bo", at(11_000))
        .await
        .expect("grant");
    f.store
        .settle_volumes(at(14_400), PERIOD)
        .await
        .expect("settle");
    let got = f.store.volume(None, &v.id, at(0)).await.expect("get");
    assert_eq!(got.unpaid_since, None);
    let check = f.store.ledger_check().await.expect("ledger");
    assert!(check.ok(), "{check:?}");
}

#[tokio::test]
async fn volumes_are_charged_per_second_of_their_size_sqlite() {
    volumes_are_charged_per_second_of_their_size(Backend::Sqlite).await;
}

#[tokio::test]
async fn volumes_are_charged_per_second_of_their_size_postgres() {
    volumes_are_charged_per_second_of_their_size(Backend::Postgres).await;
}

#[tokio::test]
async fn an_unpaid_owner_keeps_their_data_for_the_grace_sqlite() {
    an_unpaid_owner_keeps_their_data_for_the_grace(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_unpaid_owner_keeps_their_data_for_the_grace_postgres() {
    an_unpaid_owner_keeps_their_data_for_the_grace(Backend::Postgres).await;
}
