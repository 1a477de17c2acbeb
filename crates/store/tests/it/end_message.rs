//! Why an instance failed, kept where its tenant looks (issue 17): the executor's message as
//! the reservation's `end_message` (bounded, cut at a character) and a line in its log; none
//! for an instance that ended well. And the cores and memory a node's agent reported.

use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, Scope};
use gpurent_types::agent::{InstanceState, SyncRequest};
use gpurent_types::ReservationStatus;

use crate::support::{self, one_gpu, t0, Fixture};

fn failed(id: &str, state: InstanceState, exit_code: Option<i32>, message: &str) -> SyncRequest {
    let mut sync = support::report(id, 1, state, exit_code);
    sync.instances[0].message = Some(message.to_owned());
    sync
}

async fn log_text(f: &Fixture, id: &str) -> String {
    let (bytes, _) = f
        .store
        .read_logs(id, &Scope::All, 0, 1 << 20)
        .await
        .expect("read logs");
    String::from_utf8(bytes).expect("UTF-8 log")
}

async fn a_failed_start_keeps_its_reason(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 2).await;
    let alice = f.user("alice", "100").await;
    let prices = PriceList::defaults();
    let reserve = || async {
        f.store
            .reserve(one_gpu(&alice), &prices, t0(), t0(), &[])
            .await
            .expect("reserve")
            .0
    };

    // A start the executor refused: its words, in get and in the log.
    let r = reserve().await;
    let why =
        "executor docker failed to create reservation x: the image nope:1 is not on this node";
    f.store
        .sync_node(
            &node,
            &failed(&r.id, InstanceState::Failed, None, why),
            t0(),
        )
        .await
        .expect("sync");
    let got = f
        .store
        .get_reservation(&r.id, &Scope::All)
        .await
        .expect("get");
    assert_eq!(got.status, ReservationStatus::Failed);
    assert_eq!(got.end_reason.as_deref(), Some("failed_to_start"));
    assert_eq!(got.end_message.as_deref(), Some(why));
    let log = log_text(&f, &r.id).await;
    assert_eq!(log, format!("[gpurent] failed_to_start: {why}\n"));
    // ls carries it too.
    let listed = f
        .store
        .list_reservations(&Scope::All, 100, None)
        .await
        .expect("list");
    assert!(
        listed
            .iter()
            .any(|l| l.id == r.id && l.end_message.as_deref() == Some(why)),
        "{listed:?}"
    );

    // A long message is cut at a character boundary, not mid-character.
    let r = reserve().await;
    let long = "é".repeat(1500);
    f.store
        .sync_node(
            &node,
            &failed(&r.id, InstanceState::Exited, Some(1), &long),
            t0(),
        )
        .await
        .expect("sync");
    let got = f
        .store
        .get_reservation(&r.id, &Scope::All)
        .await
        .expect("get");
    assert_eq!(got.end_reason.as_deref(), Some("exited_with_error"));
    let kept = got.end_message.expect("the message");
    assert_eq!(kept, format!("{}...", "é".repeat(1000)));

    // An instance that ended well keeps no message, whatever its agent said.
    let r = reserve().await;
    f.store
        .sync_node(
            &node,
            &failed(&r.id, InstanceState::Exited, Some(0), "all good"),
            t0(),
        )
        .await
        .expect("sync");
    let got = f
        .store
        .get_reservation(&r.id, &Scope::All)
        .await
        .expect("get");
    assert_eq!(got.status, ReservationStatus::Stopped);
    assert_eq!(got.end_message, None);
    assert_eq!(log_text(&f, &r.id).await, "");
    let check = f.store.ledger_check().await.expect("ledger");
    assert!(check.ok(), "{check:?}");
}

#[tokio::test]
async fn a_failed_start_keeps_its_reason_sqlite() {
    a_failed_start_keeps_its_reason(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_failed_start_keeps_its_reason_postgres() {
    a_failed_start_keeps_its_reason(Backend::Postgres).await;
}

async fn a_node_keeps_its_cores_and_memory(backend: Backend) {
    let f = Fixture::new(backend).await;
    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 2).await;
    let listed = f.store.list_nodes(t0(), None).await.expect("nodes");
    assert_eq!((listed[0].cpus, listed[0].memory_mb), (None, None));
    f.store
        .set_capacity(&node, Some(2), Some(7851))
        .await
        .expect("set capacity");
    let listed = f.store.list_nodes(t0(), None).await.expect("nodes");
    assert_eq!((listed[0].cpus, listed[0].memory_mb), (Some(2), Some(7851)));
    assert!(f.store.set_capacity("nope", Some(1), None).await.is_err());
}

#[tokio::test]
async fn a_node_keeps_its_cores_and_memory_sqlite() {
    a_node_keeps_its_cores_and_memory(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_node_keeps_its_cores_and_memory_postgres() {
    a_node_keeps_its_cores_and_memory(Backend::Postgres).await;
}
