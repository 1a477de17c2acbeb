//! Model-based property test of billing: random schedules of reservations on every tier, agent
//! reports (duplicated and out of order), stop requests, expiry passes, settlement ticks,
//! preemptions and control-plane restarts (the store closed and reopened), and every other way
//! a reservation ends (`gpurent_billing::ending::Ending`): its workload exiting or failing to
//! start, its agent stopping it over its GPU memory, idle reclaim, its node lost (ending it or
//! queueing it again), a GPU it ran on gone from its node, drained, and a queued reservation
//! stopped or timed out, must leave every
//! reservation charged exactly what an independent model computes (the rate over the seconds
//! it ran; a reserved block in full unless the platform ended it), the tenant's balance down by
//! exactly the sum with nothing left held, the node's owner paid exactly its share, and the
//! ledger balanced; every third reservation is an endpoint's replica, charged exactly the
//! seconds it ran like the rest; every fourth is a managed job (`restart: on-failure`,
//! `max_restarts: 1`), queued again when interrupted and once when it fails, charged only the
//! seconds it ran. Volumes made, grown and removed among them are charged exactly their size
//! per second of each stretch (`gpurent_billing::storage_charge`), their node's owner paid its
//! share of a local one. On SQLite and PostgreSQL.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::Duration;
use gpurent_billing::{PriceList, BYTES_PER_GB};
use gpurent_store::prelude::*;
use gpurent_store::{Backend, NewReservation, NewVolume, NodeAction, Scope, SqlStore};
use gpurent_types::agent::{
    AgentEvent, AgentEventKind, GpuInfo, InstanceState, SyncRequest, VolumeFacts,
};
use gpurent_types::api::VolumeKind;
use gpurent_types::{GpuType, Money, OnNodeLoss, RestartPolicy, Tier};
use proptest::prelude::*;

use crate::support::{self, one_gpu, t0, Fixture};

mod model;
use model::{Model, VolumeModel, Why};

/// The tiers a schedule reserves on, with the hours each asks for.
const TIERS: [(Tier, u64); 4] = [
    (Tier::OnDemand, 1),
    (Tier::Stepped, 4),
    (Tier::Reserved, 24),
    (Tier::Spot, 1),
];

/// The node TTL of `Op::Fence`, in seconds.
const TTL_S: i64 = 30;

#[derive(Debug, Clone)]
enum Op {
    /// A tier, and whether it ends (rather than waits to run again) when its node is lost.
    Reserve(usize, bool),
    Running(usize),
    Stop(usize),
    Gone(usize),
    Exit(usize, i32),
    Fail(usize),
    /// Its agent stops it: more GPU memory than its share.
    Vram(usize),
    Expire,
    Idle,
    Settle,
    /// The node goes quiet past the TTL and is fenced.
    Fence,
    /// The agent's inventory lacks this GPU (the one missing before is back).
    GpuGone(u32),
    /// The node is drained (its work queued again), then uncordoned.
    Drain,
    /// What waits in the queue times out.
    Timeouts,
    Advance(u32),
    Restart,
    /// A volume of this many GB, on the node (or shared).
    MakeVolume(u64, bool),
    /// Volume i grows by this many GB.
    GrowVolume(usize, u64),
    RemoveVolume(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => ((0usize..TIERS.len()), any::<bool>()).prop_map(|(t, s)| Op::Reserve(t, s)),
        3 => (0usize..6).prop_map(Op::Running),
        2 => (0usize..6).prop_map(Op::Stop),
        2 => (0usize..6).prop_map(Op::Gone),
        1 => ((0usize..6), (0i32..2)).prop_map(|(i, c)| Op::Exit(i, c)),
        1 => (0usize..6).prop_map(Op::Fail),
        1 => (0usize..6).prop_map(Op::Vram),
        1 => Just(Op::Expire),
        1 => Just(Op::Idle),
        1 => Just(Op::Fence),
        1 => Just(Op::Drain),
        1 => (0u32..6).prop_map(Op::GpuGone),
        1 => Just(Op::Timeouts),
        2 => Just(Op::Settle),
        4 => (1u32..2000).prop_map(Op::Advance),
        1 => Just(Op::Restart),
        1 => ((1u64..500), any::<bool>()).prop_map(|(gb, local)| Op::MakeVolume(gb, local)),
        1 => ((0usize..3), (1u64..200)).prop_map(|(i, gb)| Op::GrowVolume(i, gb)),
        1 => (0usize..3).prop_map(Op::RemoveVolume),
    ]
}

/// The node keeps volumes, with room for any the schedule makes.
async fn keeps_volumes(store: &SqlStore, node: &str) {
    store
        .set_volume_facts(
            node,
            Some(&VolumeFacts {
                enforcement: "loop".into(),
                reason: None,
                free_bytes: 1_000_000 * BYTES_PER_GB,
                shared: true,
            }),
        )
        .await
        .unwrap();
}

fn report(id: &str, state: InstanceState, exit_code: Option<i32>) -> SyncRequest {
    support::report(id, 1, state, exit_code)
}

async fn run(backend: Backend, ops: Vec<Op>) {
    let f = Fixture::new(backend).await;
    let (node, owner) = f.node_owned("n", "NVIDIA GeForce RTX 4090", 6).await;
    let tenant = f.user("payer", "100000").await;
    let mut store: Arc<SqlStore> = f.store.clone();
    let prices = PriceList::defaults();
    let mut now = 0i64;
    let at = |s: i64| t0() + Duration::seconds(s);
    let mut models: Vec<Model> = Vec::new();
    let mut volumes: Vec<VolumeModel> = Vec::new();
    let mut reserved = 0;
    for op in ops {
        match op {
            Op::MakeVolume(gb, local) => {
                keeps_volumes(&store, &node).await;
                let v = store
                    .create_volume(
                        NewVolume {
                            owner_id: tenant.clone(),
                            name: format!("v{}", volumes.len()),
                            kind: if local {
                                VolumeKind::Local
                            } else {
                                VolumeKind::Shared
                            },
                            node_id: local.then(|| node.clone()),
                            size_bytes: gb * BYTES_PER_GB,
                            price_per_gb_month: prices.storage_per_gb_month,
                            host_share_bps: prices.host_share_bps,
                        },
                        at(now),
                    )
                    .await
                    .unwrap();
                volumes.push(VolumeModel {
                    id: v.id,
                    local,
                    stretches: vec![(now, gb)],
                    removed: None,
                });
            }
            Op::GrowVolume(i, more) => {
                let Some(v) = volumes.get_mut(i) else {
                    continue;
                };
                keeps_volumes(&store, &node).await;
                let gb = v.stretches.last().map_or(0, |(_, gb)| *gb) + more;
                let grown = store
                    .resize_volume(
                        None,
                        &v.id,
                        gb * BYTES_PER_GB,
                        prices.storage_per_gb_month,
                        at(now),
                        at(now),
                    )
                    .await;
                match (grown, v.removed) {
                    (Ok(_), None) => v.stretches.push((now, gb)),
                    (Err(e), Some(_)) => assert!(e.to_string().contains("deleting"), "{e}"),
                    (got, removed) => panic!("grown {got:?}, removed at {removed:?}"),
                }
            }
            Op::RemoveVolume(i) => {
                let Some(v) = volumes.get_mut(i) else {
                    continue;
                };
                let removed = store.remove_volume(None, &v.id, at(now), at(now)).await;
                match v.removed {
                    // Removed again: it is deleting already, charged no further.
                    Some(_) => {}
                    None => {
                        removed.unwrap();
                        v.removed = Some(now);
                    }
                }
            }
            Op::Reserve(tier, stop_on_loss) => {
                let (tier, hours) = TIERS[tier];
                // Every fourth, a managed job: restarted when interrupted, and once when it
                // fails; it never ends on its node's loss.
                let managed = reserved % 4 == 1;
                let stop_on_loss = stop_on_loss && !managed;
                let new = NewReservation {
                    duration_s: hours * 3600,
                    tier,
                    restart: if managed {
                        RestartPolicy::OnFailure
                    } else {
                        RestartPolicy::Never
                    },
                    max_restarts: u32::from(managed),
                    on_node_loss: if stop_on_loss {
                        OnNodeLoss::Stop
                    } else {
                        OnNodeLoss::Reschedule
                    },
                    idempotency_key: Some(format!("k{reserved}")),
                    // Every third, an endpoint's replica (placed by the one-reservation
                    // path): billed as any other.
                    replica_of: (reserved % 3 == 2).then(|| gpurent_store::ReplicaOf {
                        endpoint_id: "endpoint".into(),
                        index: u64::try_from(reserved).unwrap_or(0),
                        generation: 1,
                    }),
                    ..one_gpu(&tenant)
                };
                reserved += 1;
                // The node must look alive at this time.
                store
                    .sync_node(
                        &node,
                        &report("none", InstanceState::Running, None),
                        at(now),
                    )
                    .await
                    .unwrap();
                if let Ok((r, _)) = store
                    .reserve(new, &prices, at(now) - Duration::seconds(10), at(now), &[])
                    .await
                {
                    let quote = prices
                        .quote(
                            &GpuType::parse("rtx4090").unwrap(),
                            gpurent_billing::Size::Whole {
                                count: 1,
                                gpu_vram_mb: 24_576,
                            },
                            hours * 3600,
                            tier,
                            None,
                        )
                        .unwrap();
                    assert_eq!(r.price_per_hour, quote.price_per_hour);
                    models.push(Model {
                        id: r.id,
                        tier,
                        rate: quote.rate,
                        duration: i64::try_from(hours * 3600).unwrap(),
                        start: None,
                        stop_at: None,
                        end: None,
                        platform_ended: false,
                        stop_on_loss,
                        queued: false,
                        run_before: 0,
                        managed,
                        counted: 0,
                        requeued: 0,
                        stop_why: None,
                    });
                    // Work that outranks spot instances may have preempted some: billing
                    // stopped for them now.
                    for m in models.iter_mut().filter(|m| m.tier == Tier::Spot) {
                        let r = store.get_reservation(&m.id, &Scope::All).await.unwrap();
                        if r.end_reason.as_deref() == Some("preempted") && m.movable() {
                            m.stop_at = Some(now);
                            m.stop_why = Some(Why::Preempted);
                        }
                    }
                }
            }
            Op::Running(i) => {
                let Some(m) = models.get_mut(i) else { continue };
                store
                    .sync_node(&node, &report(&m.id, InstanceState::Running, None), at(now))
                    .await
                    .unwrap();
                if m.start.is_none() && m.movable() {
                    m.start = Some(now);
                }
            }
            Op::Stop(i) => {
                let Some(m) = models.get_mut(i) else { continue };
                store
                    .request_stop(&m.id, &Scope::All, at(now))
                    .await
                    .unwrap();
                m.stop(now, Why::Tenant);
            }
            Op::Gone(i) | Op::Exit(i, _) | Op::Fail(i) => {
                let Some(m) = models.get_mut(i) else { continue };
                let (state, code) = match op {
                    Op::Exit(_, c) => (InstanceState::Exited, Some(c)),
                    Op::Fail(_) => (InstanceState::Failed, None),
                    _ => (InstanceState::Stopped, None),
                };
                store
                    .sync_node(&node, &report(&m.id, state, code), at(now))
                    .await
                    .unwrap();
                // A report of its run on the node it left changes nothing.
                if m.queued {
                    continue;
                }
                let failed = match state {
                    InstanceState::Exited => Some(code != Some(0)),
                    InstanceState::Failed => Some(true),
                    _ => None,
                };
                if m.restarts(now, failed) {
                    continue;
                }
                if m.end.is_none() && state != InstanceState::Exited && m.unasked(now) {
                    m.platform_ended = true;
                }
                m.gone(now);
            }
            Op::Vram(i) => {
                let Some(m) = models.get_mut(i) else { continue };
                let watchdog = SyncRequest {
                    events: vec![AgentEvent {
                        kind: AgentEventKind::VramExceeded,
                        reservation_id: Some(m.id.clone()),
                        gpu_uuid: "GPU-n-0".to_owned(),
                        detail: "over its share".to_owned(),
                    }],
                    ..report("none", InstanceState::Running, None)
                };
                store.sync_node(&node, &watchdog, at(now)).await.unwrap();
                if m.running() {
                    m.stop(now, Why::Vram);
                }
            }
            Op::Idle => {
                // No telemetry: every reservation running a minute is idle.
                store.reclaim_idle(at(now - 60), at(now)).await.unwrap();
                for m in models
                    .iter_mut()
                    .filter(|m| m.running() && m.start.is_some_and(|s| s <= now - 60))
                {
                    m.stop(now, Why::Idle);
                }
            }
            Op::Fence => {
                // Heard from now, then not for longer than the TTL.
                store
                    .sync_node(
                        &node,
                        &report("none", InstanceState::Running, None),
                        at(now),
                    )
                    .await
                    .unwrap();
                let fence_at = now + TTL_S;
                now += TTL_S + 1;
                store
                    .fence_lost_nodes(StdDuration::from_secs(30), at(now))
                    .await
                    .unwrap();
                for m in &mut models {
                    m.fence(fence_at);
                }
            }
            Op::GpuGone(gone) => {
                let uuid = format!("GPU-n-{gone}");
                // Which reservations hold memory on it is the placement's business: read it.
                let mut on_it = Vec::new();
                for (i, m) in models.iter().enumerate() {
                    let r = store.get_reservation(&m.id, &Scope::All).await.unwrap();
                    // A preempted one gave its GPUs back when it was preempted.
                    if !r.status.is_terminal()
                        && r.gpus.contains(&uuid)
                        && r.end_reason.as_deref() != Some("preempted")
                    {
                        on_it.push(i);
                    }
                }
                let inventory = SyncRequest {
                    gpus: (0..6)
                        .filter(|g| *g != gone)
                        .map(|g| {
                            GpuInfo::basic(
                                g,
                                format!("GPU-n-{g}"),
                                "NVIDIA GeForce RTX 4090".to_owned(),
                                24_576,
                            )
                        })
                        .collect(),
                    ..report("none", InstanceState::Running, None)
                };
                store.sync_node(&node, &inventory, at(now)).await.unwrap();
                for i in on_it {
                    models[i].fence(now);
                }
            }
            Op::Drain => {
                // A lost node cannot be drained: heard from again first.
                store
                    .sync_node(
                        &node,
                        &report("none", InstanceState::Running, None),
                        at(now),
                    )
                    .await
                    .unwrap();
                store
                    .schedule_node(&node, NodeAction::Drain, at(now))
                    .await
                    .unwrap();
                store
                    .schedule_node(&node, NodeAction::Uncordon, at(now))
                    .await
                    .unwrap();
                for m in models.iter_mut().filter(|m| m.movable()) {
                    m.requeue(now);
                }
            }
            Op::Timeouts => {
                store.end_queue_timeouts(at(now), at(now)).await.unwrap();
                // A managed job waits for capacity however long it takes.
                for m in models
                    .iter_mut()
                    .filter(|m| m.queued && m.end.is_none() && !m.managed)
                {
                    m.end = Some(now);
                }
            }
            Op::Expire => {
                store.expire_due(at(now)).await.unwrap();
                for m in models.iter_mut().filter(|m| m.movable()) {
                    if let Some(s) = m.start.filter(|s| now >= s + m.duration) {
                        m.stop_at = Some(s + m.duration);
                        m.stop_why = Some(Why::Expired);
                    }
                }
            }
            Op::Settle => {
                store
                    .settle_due(at(now), StdDuration::from_secs(60))
                    .await
                    .unwrap();
                store
                    .settle_volumes(at(now), StdDuration::from_secs(60))
                    .await
                    .unwrap();
            }
            Op::Advance(s) => now += i64::from(s),
            Op::Restart => {
                let url = f._db.url.clone();
                store.close().await;
                store = Arc::new(SqlStore::connect(&url).await.unwrap());
            }
        }
    }
    // Wind everything down: stop what is left and let the agent confirm, twice.
    now += 1;
    for m in &mut models {
        store
            .request_stop(&m.id, &Scope::All, at(now))
            .await
            .unwrap();
        m.stop(now, Why::Tenant);
        for _ in 0..2 {
            store
                .sync_node(
                    &node,
                    &report(&m.id, InstanceState::Stopped, None),
                    at(now + 5),
                )
                .await
                .unwrap();
        }
        m.gone(now + 5);
    }

    let mut total = Money::ZERO;
    for m in &models {
        let r = store.get_reservation(&m.id, &Scope::All).await.unwrap();
        assert!(r.status.is_terminal(), "{} is {}", m.id, r.status);
        assert_eq!(
            r.charged,
            m.charge(),
            "reservation {} ({:?}): {r:?}",
            m.id,
            m
        );
        // Queued again exactly when the model was: its restarts listed, one each.
        assert_eq!(r.restarts.len(), m.requeued, "{} ({m:?}): {r:?}", m.id);
        total = total.checked_add(m.charge()).unwrap();
    }
    // The volumes left are charged up to the end too.
    store
        .settle_volumes(at(now + 5), StdDuration::from_secs(1))
        .await
        .unwrap();
    let listed = store
        .list_volumes(Some(&tenant), 100, None, at(now))
        .await
        .unwrap();
    for v in &volumes {
        let got = listed.iter().find(|l| l.id == v.id);
        // A removed volume is listed while its node has not deleted it (here: never).
        let got = got.unwrap_or_else(|| panic!("volume {} not listed", v.id));
        assert_eq!(got.charged, v.charge(now + 5), "volume {v:?}: {got:?}");
        total = total.checked_add(v.charge(now + 5)).unwrap();
    }
    let (balance, held, _) = store.accounts(&tenant).await.unwrap();
    assert_eq!(Money::units(100_000).checked_sub(balance), Some(total));
    assert_eq!(held, Money::ZERO);
    // The owner's share is rounded down once per reservation and per local volume, on its
    // total.
    let share: i64 = models
        .iter()
        .map(|m| m.charge().micros() * 8_000 / 10_000)
        .chain(
            volumes
                .iter()
                .filter(|v| v.local)
                .map(|v| v.charge(now + 5).micros() * 8_000 / 10_000),
        )
        .sum();
    let (_, _, earned) = store.accounts(&owner).await.unwrap();
    assert_eq!(earned, Money::from_micros(share));
    let ledger = store.ledger_check().await.unwrap();
    assert!(ledger.ok(), "{ledger:?}");
    let problems = store.allocation_problems().await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    store.close().await;
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn charges_match_the_model_on_sqlite(ops in proptest::collection::vec(op(), 1..60)) {
        runtime().block_on(run(Backend::Sqlite, ops));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn charges_match_the_model_on_postgres(ops in proptest::collection::vec(op(), 1..60)) {
        runtime().block_on(run(Backend::Postgres, ops));
    }
}
