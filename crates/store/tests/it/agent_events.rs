//! What the agent's VRAM watchdog reports (issue 17): its events kept with their reservation
//! and written into that reservation's log, and an instance it stopped ended `failed` with its
//! end reason, billed to when the agent decided to stop it.

use chrono::Duration;
use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, Scope};
use gpurent_types::agent::{AgentEvent, AgentEventKind, InstanceState, SyncRequest};
use gpurent_types::ReservationStatus;

use crate::support::{self, one_gpu, t0, Fixture};

async fn reservation(f: &Fixture, id: &str) -> gpurent_types::api::Reservation {
    f.store.get_reservation(id, &Scope::All).await.expect("get")
}

/// One node running one reservation (epoch 1): the fixture, the node, the reservation.
async fn running(backend: Backend) -> (Fixture, String, String) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 1).await;
    let alice = f.user("alice", "100").await;
    let (r, _) = f
        .store
        .reserve(one_gpu(&alice), &PriceList::defaults(), t0(), t0(), &[])
        .await
        .expect("reserve");
    f.store
        .sync_node(
            &node,
            &support::report(&r.id, 1, InstanceState::Running, None),
            t0(),
        )
        .await
        .expect("running");
    (f, node, r.id)
}

fn event(kind: AgentEventKind, reservation_id: Option<&str>, detail: &str) -> AgentEvent {
    AgentEvent {
        kind,
        reservation_id: reservation_id.map(str::to_owned),
        gpu_uuid: "GPU-0".to_owned(),
        detail: detail.to_owned(),
    }
}

fn with_events(events: Vec<AgentEvent>) -> SyncRequest {
    SyncRequest {
        instances: vec![],
        events,
        ..support::report("", 1, InstanceState::Running, None)
    }
}

async fn log_text(f: &Fixture, id: &str) -> String {
    let (bytes, _) = f
        .store
        .read_logs(id, &Scope::All, 0, 1024 * 1024)
        .await
        .expect("read");
    String::from_utf8_lossy(&bytes).into_owned()
}

async fn events_are_kept_and_written_into_the_reservations_log(backend: Backend) {
    let (f, node, id) = running(backend).await;
    let other = f.node("n2", "NVIDIA GeForce RTX 4090", 1).await;
    let before = f.store.last_event_id().await.expect("last");
    f.store
        .sync_node(
            &node,
            &with_events(vec![
                event(AgentEventKind::VramOverShare, Some(&id), "over its share"),
                event(
                    AgentEventKind::UnownedGpuProcess,
                    None,
                    "process 7 of no instance",
                ),
            ]),
            t0(),
        )
        .await
        .expect("sync");
    // Another node cannot write into this reservation's log.
    f.store
        .sync_node(
            &other,
            &with_events(vec![event(AgentEventKind::ForeignGpu, Some(&id), "forged")]),
            t0(),
        )
        .await
        .expect("sync");
    let events = f.store.events(before, 100).await.expect("events");
    let seen: Vec<(&str, Option<&str>, &str)> = events
        .iter()
        .map(|e| {
            (
                e.kind.as_str(),
                e.reservation_id.as_deref(),
                e.detail.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("vram_over_share", Some(id.as_str()), "over its share"),
            ("unowned_gpu_process", None, "process 7 of no instance"),
        ]
    );
    assert!(events
        .iter()
        .all(|e| e.node_id.as_deref() == Some(node.as_str())));
    assert_eq!(log_text(&f, &id).await, "[gpurent] over its share\n");
}

async fn an_instance_the_agent_stopped_ends_with_its_reason(backend: Backend) {
    let (f, node, id) = running(backend).await;
    // The agent decides and says so at once (the instance still running); its stop is
    // reported two seconds later, once the instance is gone.
    let decided = t0() + Duration::seconds(60);
    let mut report = support::report(&id, 1, InstanceState::Running, None);
    report.events = vec![event(
        AgentEventKind::VramExceeded,
        Some(&id),
        "stopped (vram_exceeded)",
    )];
    f.store
        .sync_node(&node, &report, decided)
        .await
        .expect("sync");
    let r = reservation(&f, &id).await;
    assert_eq!(
        r.status,
        ReservationStatus::Stopping,
        "billing stopped at the decision"
    );
    let why = "GPU memory 46080 MiB on GPU-0, over the share's 40960 MiB for 10 s, the grace";
    let mut report = support::report(&id, 1, InstanceState::Stopped, None);
    report.instances[0].end_reason = Some("vram_exceeded".to_owned());
    report.instances[0].message = Some(why.to_owned());
    f.store
        .sync_node(&node, &report, decided + Duration::seconds(2))
        .await
        .expect("sync");
    let r = reservation(&f, &id).await;
    assert_eq!(
        (r.status, r.end_reason.as_deref()),
        (ReservationStatus::Failed, Some("vram_exceeded"))
    );
    assert_eq!(r.ended_at, Some(decided), "billed to the agent's decision");
    let ran = r
        .ended_at
        .zip(r.started_at)
        .map(|(e, s)| (e - s).num_seconds());
    assert_eq!(
        r.charged,
        gpurent_billing::Rate::flat(r.price_per_hour)
            .charge_for_seconds(u64::try_from(ran.unwrap_or(0)).unwrap_or(0)),
        "charged for the seconds to the decision"
    );
    // Its reason is kept, and written into its log once: by its ending, not by the event too.
    assert_eq!(r.end_message.as_deref(), Some(why));
    assert_eq!(
        log_text(&f, &id).await,
        format!("[gpurent] vram_exceeded: {why}\n")
    );
}

async fn an_end_reason_the_agent_may_not_give_is_ignored(backend: Backend) {
    let (f, node, id) = running(backend).await;
    let mut report = support::report(&id, 1, InstanceState::Stopped, None);
    report.instances[0].end_reason = Some("expired".to_owned());
    f.store.sync_node(&node, &report, t0()).await.expect("sync");
    let r = reservation(&f, &id).await;
    assert_eq!(
        (r.status, r.end_reason.as_deref()),
        (ReservationStatus::Stopped, Some("stopped_by_agent"))
    );
}

async fn a_stop_asked_for_first_keeps_its_reason(backend: Backend) {
    let (f, node, id) = running(backend).await;
    let asked = t0() + Duration::seconds(10);
    f.store
        .request_stop(&id, &Scope::All, asked)
        .await
        .expect("stop");
    let mut report = support::report(&id, 1, InstanceState::Stopped, None);
    report.instances[0].end_reason = Some("vram_exceeded".to_owned());
    f.store
        .sync_node(&node, &report, asked + Duration::seconds(5))
        .await
        .expect("sync");
    let r = reservation(&f, &id).await;
    assert_eq!(r.status, ReservationStatus::Stopped);
    assert_ne!(r.end_reason.as_deref(), Some("vram_exceeded"));
    assert_eq!(r.ended_at, Some(asked));
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test]
            async fn sqlite() {
                super::$name(Backend::Sqlite).await;
            }
            #[tokio::test]
            async fn postgres() {
                super::$name(Backend::Postgres).await;
            }
        }
    )*};
}

on_both!(
    events_are_kept_and_written_into_the_reservations_log,
    an_instance_the_agent_stopped_ends_with_its_reason,
    an_end_reason_the_agent_may_not_give_is_ignored,
    a_stop_asked_for_first_keeps_its_reason,
);
