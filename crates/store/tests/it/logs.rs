//! Instances' output in the store (issue 14): bytes kept as they are and counted as bytes,
//! chunks checked against their real size and their epoch, read from exactly the byte asked
//! for, capped with the run's end kept, and pruned past the retention.

use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, Scope};
use gpurent_types::agent::{InstanceState, LogChunk, SyncRequest, LOG_CAP_BYTES, LOG_TAIL_BYTES};

use crate::support::{self, one_gpu, t0, Fixture};

/// A fixture with one node running one reservation (epoch 1); its node and reservation ids.
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
        .sync_node(&node, &report(&r.id, InstanceState::Running), t0())
        .await
        .expect("running");
    (f, node, r.id)
}

fn report(id: &str, state: InstanceState) -> SyncRequest {
    support::report(id, 1, state, None)
}

async fn ship(f: &Fixture, node: &str, chunks: Vec<LogChunk>) {
    let mut sync = SyncRequest {
        instances: vec![],
        ..support::report("", 1, InstanceState::Running, None)
    };
    sync.logs = chunks;
    f.store.sync_node(node, &sync, t0()).await.expect("sync");
}

async fn log_of(f: &Fixture, id: &str) -> Vec<u8> {
    let (bytes, next) = f
        .store
        .read_logs(id, &Scope::All, 0, 64 * 1024 * 1024)
        .await
        .expect("read");
    assert_eq!(next, bytes.len() as u64);
    bytes
}

async fn bytes_are_kept_as_they_are(backend: Backend) {
    let (f, node, id) = running(backend).await;
    let first: Vec<u8> = (0..=255).collect();
    let second = vec![0xff_u8; 100_000];
    ship(&f, &node, vec![LogChunk::of_bytes(&id, 1, 0, &first)]).await;
    ship(&f, &node, vec![LogChunk::of_bytes(&id, 1, 256, &second)]).await;
    let log = log_of(&f, &id).await;
    assert_eq!(log.len(), 100_256, "stored at its size");
    assert!(log[..256] == first[..] && log[256..] == second[..]);
    // A repeat (an agent that missed the answer) adds nothing; a partial repeat its new part.
    ship(&f, &node, vec![LogChunk::of_bytes(&id, 1, 256, &second)]).await;
    ship(
        &f,
        &node,
        vec![LogChunk::of_bytes(&id, 1, 100_250, b"123456789")],
    )
    .await;
    let log = log_of(&f, &id).await;
    assert_eq!(&log[100_250..], b"\xff\xff\xff\xff\xff\xff789");
    // An older agent's text chunk is taken as its UTF-8 bytes.
    let text = LogChunk {
        reservation_id: id.clone(),
        epoch: None,
        offset: 100_259,
        length: 3,
        data: "é!".into(),
        data_base64: None,
    };
    ship(&f, &node, vec![text]).await;
    assert!(log_of(&f, &id).await.ends_with("é!".as_bytes()));
}

async fn a_chunk_longer_than_it_says_is_refused(backend: Backend) {
    let (f, node, id) = running(backend).await;
    // A host's agent declares one byte and sends 3.9 MB, four times.
    let big = vec![b'x'; 3_900_000];
    let lying = (0..4)
        .map(|i| LogChunk {
            length: 1,
            ..LogChunk::of_bytes(&id, 1, i, &big)
        })
        .collect();
    ship(&f, &node, lying).await;
    assert_eq!(log_of(&f, &id).await.len(), 0, "what lying chunks stored");
    // Nor does another epoch's output, or a chunk past a gap, get in; an honest one does.
    ship(&f, &node, vec![LogChunk::of_bytes(&id, 2, 0, b"stale")]).await;
    ship(&f, &node, vec![LogChunk::of_bytes(&id, 1, 10, b"gap")]).await;
    ship(&f, &node, vec![LogChunk::of_bytes(&id, 1, 0, b"honest\n")]).await;
    assert_eq!(log_of(&f, &id).await, b"honest\n");
}

async fn a_read_starts_at_its_offset(backend: Backend) {
    let (f, node, id) = running(backend).await;
    for (at, part) in [(0, &b"hello\n"[..]), (6, b"wor"), (9, b"ld\n")] {
        ship(&f, &node, vec![LogChunk::of_bytes(&id, 1, at, part)]).await;
    }
    let all = b"hello\nworld\n";
    for offset in 0..=13_u64 {
        for max in [1_u64, 4, 100] {
            let (bytes, next) = f
                .store
                .read_logs(&id, &Scope::All, offset, max)
                .await
                .expect("read");
            let from = usize::try_from(offset).unwrap().min(all.len());
            let to = (from + usize::try_from(max).unwrap()).min(all.len());
            assert_eq!(
                (bytes.as_slice(), next),
                (&all[from..to], offset + (to - from) as u64),
                "offset {offset}, max {max}"
            );
        }
    }
}

async fn past_the_cap_the_head_a_marker_and_the_tail(backend: Backend) {
    let (f, node, id) = running(backend).await;
    let head = usize::try_from(LOG_CAP_BYTES - LOG_TAIL_BYTES).unwrap();
    let tail = usize::try_from(LOG_TAIL_BYTES).unwrap();
    // The head in 1 MiB chunks, the last one running past it.
    let mut at = 0;
    while at < head {
        ship(
            &f,
            &node,
            vec![LogChunk::of_bytes(&id, 1, at as u64, &vec![b'h'; 1 << 20])],
        )
        .await;
        at += 1 << 20;
    }
    // Nothing more fits but the end of the run; the sync says so.
    assert_eq!(f.store.log_rooms(&node).await.expect("rooms")[&id], 0);
    let end = 40 << 20;
    let mut last = vec![b't'; tail];
    last[tail - 1] = b'\n';
    ship(
        &f,
        &node,
        vec![LogChunk::of_bytes(&id, 1, (end - tail) as u64, &last)],
    )
    .await;
    // More than the tail keeps is dropped.
    ship(
        &f,
        &node,
        vec![LogChunk::of_bytes(&id, 1, end as u64, b"more")],
    )
    .await;
    let log = log_of(&f, &id).await;
    assert!(log[..head].iter().all(|&b| b == b'h'));
    let marker = String::from_utf8(log[head..log.len() - tail].to_vec()).expect("text");
    assert_eq!(
        marker,
        format!(
            "\n[gpurent: {} bytes of output left out here; a log keeps the first {head} bytes and the last {tail} of each run]\n",
            end - tail - head
        )
    );
    assert!(log[log.len() - tail..] == last[..]);
    assert!(log.len() as u64 <= LOG_CAP_BYTES + 200);
}

async fn logs_of_long_ended_reservations_are_pruned(backend: Backend) {
    let (f, node, id) = running(backend).await;
    ship(
        &f,
        &node,
        vec![LogChunk::of_bytes(&id, 1, 0, b"kept a while\n")],
    )
    .await;
    let ended_at = t0() + chrono::Duration::hours(1);
    f.store
        .sync_node(
            &node,
            &support::report(&id, 1, InstanceState::Exited, Some(0)),
            ended_at,
        )
        .await
        .expect("exit");
    // Output of a reservation that ended is not taken any more.
    ship(&f, &node, vec![LogChunk::of_bytes(&id, 1, 13, b"late")]).await;
    assert_eq!(log_of(&f, &id).await, b"kept a while\n");
    // Within the retention (ended after `before`), kept; past it, pruned, once.
    let kept = f.store.prune_logs(ended_at).await.expect("prune");
    assert_eq!((kept, log_of(&f, &id).await.len()), (0, 13));
    let pruned = f
        .store
        .prune_logs(ended_at + chrono::Duration::seconds(1))
        .await
        .expect("prune");
    assert_eq!((pruned, log_of(&f, &id).await.len()), (1, 0));
    let again = f
        .store
        .prune_logs(ended_at + chrono::Duration::days(1))
        .await
        .expect("prune");
    assert_eq!(again, 0);
}

/// The platform's notes go on a line of their own, after what the log holds, and the output
/// shipped after them still lands (the agent's offset does not move).
async fn platform_notes_go_on_their_own_line(backend: Backend) {
    let (f, node, id) = running(backend).await;
    f.store
        .append_log_note(&id, "first note")
        .await
        .expect("note");
    ship(
        &f,
        &node,
        vec![LogChunk::of_bytes(&id, 1, 0, b"no newline")],
    )
    .await;
    f.store
        .append_log_note(&id, "over\nits share\n")
        .await
        .expect("note");
    ship(&f, &node, vec![LogChunk::of_bytes(&id, 1, 10, b"more\n")]).await;
    assert_eq!(
        String::from_utf8_lossy(&log_of(&f, &id).await),
        "[gpurent] first note\nno newline\n[gpurent] over its share\nmore\n"
    );
    // A long note is cut, not refused; an unknown reservation is.
    f.store
        .append_log_note(&id, &"é".repeat(5000))
        .await
        .expect("long note");
    assert!(log_of(&f, &id).await.len() < 2100);
    assert!(f.store.append_log_note("nope", "x").await.is_err());
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
    bytes_are_kept_as_they_are,
    a_chunk_longer_than_it_says_is_refused,
    a_read_starts_at_its_offset,
    past_the_cap_the_head_a_marker_and_the_tail,
    logs_of_long_ended_reservations_are_pruned,
    platform_notes_go_on_their_own_line,
);
