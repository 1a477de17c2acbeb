//! The audit trail in the database: appends chain and checkpoint; a record changed, removed,
//! moved or cut off the end directly in the database is named by verification; pruning keeps
//! whole checkpointed segments and the rest still verifies.

use gpurent_audit::{Entry, Problem, Signer};
use gpurent_store::prelude::*;
use gpurent_store::{verify_audit, AuditFilter, Backend, CheckpointPolicy};

use crate::support::{t0, Fixture};

fn entry(i: u64) -> Entry {
    Entry {
        request_id: format!("req-{i}"),
        at: t0() + chrono::Duration::seconds(i64::try_from(i).unwrap()),
        user_id: Some(format!("usr_{}", i % 3)),
        action: "POST /api/v1/reservations".into(),
        resource: format!("/api/v1/reservations/res_{i}"),
        allocation: i
            .is_multiple_of(2)
            .then(|| "1x RTX 4090 on box-1: GPU-a".to_owned()),
        outcome: 201,
        client: "127.0.0.1:5000".into(),
    }
}

const POLICY: CheckpointPolicy = CheckpointPolicy {
    every_records: 100,
    every: std::time::Duration::from_secs(3600),
};

/// 350 records in batches of 50: checkpoints at 50 (the first append: none before), 150, 250
/// and 350.
async fn trail(backend: Backend) -> (Fixture, Signer) {
    let f = Fixture::new(backend).await;
    let signer = Signer::from_seed([9; 32]);
    for batch in 0..7u64 {
        let entries: Vec<Entry> = (1..=50).map(|i| entry(batch * 50 + i)).collect();
        let now = entries[49].at;
        let head = f
            .store
            .append_audit(&entries, &signer, POLICY, now)
            .await
            .unwrap();
        assert_eq!(head, (batch + 1) * 50);
    }
    (f, signer)
}

async fn raw(f: &Fixture, sql: &str) {
    sqlx::any::install_default_drivers();
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&f.url())
        .await
        .unwrap();
    for statement in sql.split(';').filter(|s| !s.trim().is_empty()) {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
}

async fn first_bad(f: &Fixture, signer: &Signer) -> (u64, Problem) {
    let verdict = verify_audit(&*f.store, &signer.public_key()).await.unwrap();
    assert!(!verdict.ok);
    let bad = verdict.first_bad.unwrap();
    (bad.seq, bad.problem)
}

async fn appends_chain_and_verify(backend: Backend) {
    let (f, signer) = trail(backend).await;
    let verdict = verify_audit(&*f.store, &signer.public_key()).await.unwrap();
    assert!(verdict.ok, "{verdict:?}");
    assert_eq!((verdict.records, verdict.checkpoints), (350, 4));
    // Another key did not sign it.
    let other = Signer::from_seed([1; 32]);
    let (seq, problem) = first_bad(&f, &other).await;
    assert_eq!((seq, problem), (50, Problem::BadSignature));

    // Search by user, resource and time.
    let filter = AuditFilter {
        user_id: Some("usr_1".into()),
        ..Default::default()
    };
    let mine = f.store.audit_records(&filter, 0, 1000).await.unwrap();
    assert_eq!(mine.len(), 117);
    assert!(mine
        .iter()
        .all(|r| r.entry.user_id.as_deref() == Some("usr_1")));
    let filter = AuditFilter {
        resource: Some("res_42".into()),
        ..Default::default()
    };
    let one = f.store.audit_records(&filter, 0, 1000).await.unwrap();
    assert_eq!(one.iter().map(|r| r.seq).collect::<Vec<_>>(), [42]);
    let filter = AuditFilter {
        from: Some(t0() + chrono::Duration::seconds(10)),
        to: Some(t0() + chrono::Duration::seconds(20)),
        ..Default::default()
    };
    let window = f.store.audit_records(&filter, 0, 1000).await.unwrap();
    assert_eq!(window.first().map(|r| r.seq), Some(10));
    assert_eq!(window.len(), 10);
    let page = f
        .store
        .audit_records(&AuditFilter::default(), 340, 5)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [341, 342, 343, 344, 345]
    );
}

async fn a_changed_record_is_named(backend: Backend) {
    let (f, signer) = trail(backend).await;
    raw(&f, "UPDATE audit_log SET outcome = 200 WHERE seq = 123").await;
    assert_eq!(first_bad(&f, &signer).await, (123, Problem::Altered));
}

async fn a_deleted_record_is_named(backend: Backend) {
    let (f, signer) = trail(backend).await;
    raw(&f, "DELETE FROM audit_log WHERE seq = 150").await;
    assert_eq!(first_bad(&f, &signer).await, (150, Problem::Missing));
}

async fn reordered_records_are_named(backend: Backend) {
    let (f, signer) = trail(backend).await;
    raw(
        &f,
        "UPDATE audit_log SET seq = -1 WHERE seq = 201;
         UPDATE audit_log SET seq = 201 WHERE seq = 202;
         UPDATE audit_log SET seq = 202 WHERE seq = -1",
    )
    .await;
    assert_eq!(first_bad(&f, &signer).await, (201, Problem::OutOfOrder));
}

async fn records_cut_off_the_end_are_named(backend: Backend) {
    let (f, signer) = trail(backend).await;
    raw(&f, "DELETE FROM audit_log WHERE seq > 340").await;
    assert_eq!(first_bad(&f, &signer).await, (341, Problem::Missing));
}

async fn a_rewritten_tail_is_caught_by_the_checkpoint(backend: Backend) {
    let (f, signer) = trail(backend).await;
    // Rewriting everything after 250 consistently, head included, still leaves the checkpoint
    // at 300 with the old hash.
    raw(&f, "DELETE FROM audit_log WHERE seq > 250").await;
    raw(
        &f,
        "UPDATE audit_head SET seq = 250, hash = (SELECT hash FROM audit_log WHERE seq = 250)",
    )
    .await;
    assert_eq!(first_bad(&f, &signer).await, (251, Problem::Missing));
}

async fn pruning_keeps_whole_segments(backend: Backend) {
    let (f, signer) = trail(backend).await;
    // Records up to 299 are older than this: pruned up to the checkpoint before (250).
    let pruned = f
        .store
        .prune_audit(t0() + chrono::Duration::seconds(300))
        .await
        .unwrap();
    assert_eq!(pruned, 250);
    let anchor = f.store.audit_anchor().await.unwrap().unwrap();
    assert_eq!(anchor.seq, 250);
    let verdict = verify_audit(&*f.store, &signer.public_key()).await.unwrap();
    assert!(verdict.ok, "{verdict:?}");
    assert_eq!((verdict.records, verdict.checkpoints), (100, 1));
    // Nothing more is old enough; appends go on after the head.
    assert_eq!(f.store.prune_audit(t0()).await.unwrap(), 0);
    let head = f
        .store
        .append_audit(&[entry(351)], &signer, POLICY, t0())
        .await
        .unwrap();
    assert_eq!(head, 351);
    assert!(
        verify_audit(&*f.store, &signer.public_key())
            .await
            .unwrap()
            .ok
    );
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(gpurent_store::Backend::Sqlite).await;
            }

            #[tokio::test]
            async fn postgres() {
                super::$name(gpurent_store::Backend::Postgres).await;
            }
        }
    )*};
}

on_both!(
    appends_chain_and_verify,
    a_changed_record_is_named,
    a_deleted_record_is_named,
    reordered_records_are_named,
    records_cut_off_the_end_are_named,
    a_rewritten_tail_is_caught_by_the_checkpoint,
    pruning_keeps_whole_segments,
);
