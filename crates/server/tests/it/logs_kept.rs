//! What of an instance's output is kept (issue 14): all of it up to the cap, shipped before
//! its end is reported; past the cap its head, a marker and its last 64 KiB; its bytes as they
//! were (not UTF-8 or not); each epoch's once and in order after a reschedule; read from
//! exactly the byte asked for; and pruned once its reservation ended longer ago than kept.

use std::time::Duration;

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::{Client, TestApp};
use crate::both_stores;

/// Shipping megabytes of output takes some heartbeats.
const MINUTE: Duration = Duration::from_secs(60);

/// Reserves the process node's GPU for `script` (run by `sh -c`).
async fn run_script(client: &Client, script: &str) -> String {
    let (status, r) = client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "command": ["sh", "-c", script]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    r["id"].as_str().expect("id").to_owned()
}

fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let tail: String = text
        .chars()
        .rev()
        .take(120)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("{} bytes, ending {tail:?}", bytes.len())
}

async fn a_million_bytes_keep_their_last_line(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_process_node("proc-node", Duration::from_secs(10))
        .await;
    let t = app.tenant("ann", "10").await;
    let id = run_script(
        &t.client,
        "head -c 1000000 /dev/zero | tr '\\0' x; echo; echo LAST LINE",
    )
    .await;
    let r = t.client.wait_status(&id, "stopped", MINUTE).await;
    assert_eq!(r["end_reason"], "exited", "{r}");
    // Its end is reported once its output is in: nothing to wait for.
    let log = t.client.whole_log(&id).await;
    let mut expected = vec![b'x'; 1_000_000];
    expected.extend_from_slice(b"\nLAST LINE\n");
    assert!(log == expected, "the log: {}", show(&log));
    app.shutdown().await;
}
both_stores!(a_million_bytes, a_million_bytes_keep_their_last_line);

/// The cap per reservation, with what is kept of the tail past it.
const CAP: usize = 16 * 1024 * 1024;
const TAIL: usize = 64 * 1024;

async fn past_the_cap_head_marker_and_tail(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_process_node("proc-node", Duration::from_secs(10))
        .await;
    let t = app.tenant("ann", "10").await;
    // 17 MiB of 'x', then a last line.
    let id = run_script(
        &t.client,
        "head -c 17825792 /dev/zero | tr '\\0' x; echo; echo LAST LINE",
    )
    .await;
    t.client.wait_status(&id, "stopped", MINUTE).await;
    let log = t.client.whole_log(&id).await;
    let text = String::from_utf8_lossy(&log);
    assert!(text.ends_with("x\nLAST LINE\n"), "the log: {}", show(&log));
    let marker = text
        .find("[gpurent:")
        .unwrap_or_else(|| panic!("no gap marker in the log: {}", show(&log)));
    assert!(log[..marker].iter().all(|&b| b == b'x' || b == b'\n'));
    assert!(marker >= CAP - TAIL - 1, "the head kept: {marker} bytes");
    let after = marker + text[marker..].find('\n').expect("the marker's line") + 1;
    assert_eq!(log.len() - after, TAIL, "the tail kept");
    assert!(log.len() <= CAP + 200, "{} bytes kept in all", log.len());
    app.shutdown().await;
}
both_stores!(past_the_cap, past_the_cap_head_marker_and_tail);

async fn invalid_utf8_is_kept_as_its_bytes(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_process_node("proc-node", Duration::from_secs(10))
        .await;
    let t = app.tenant("ann", "10").await;
    // 100,000 bytes that are not UTF-8, then a line that is, then a lone lead byte: 100,007.
    let id = run_script(
        &t.client,
        "head -c 100000 /dev/zero | tr '\\0' '\\377'; printf 'ok \\303\\251\\n\\303'",
    )
    .await;
    t.client.wait_status(&id, "stopped", MINUTE).await;
    let log = t.client.whole_log(&id).await;
    let mut expected = vec![0xff_u8; 100_000];
    expected.extend_from_slice(b"ok \xc3\xa9\n\xc3");
    assert_eq!(
        log.len(),
        expected.len(),
        "bytes stored for 100,007 of output"
    );
    assert!(log == expected, "the log: {}", show(&log));
    let stored = app
        .raw_count("SELECT COUNT(*) FROM reservations WHERE log_bytes = 100007")
        .await;
    assert_eq!(stored, 1, "the reservation counts its output in bytes");
    app.shutdown().await;
}
both_stores!(invalid_utf8, invalid_utf8_is_kept_as_its_bytes);

async fn an_offset_reads_from_that_byte(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_process_node("proc-node", Duration::from_secs(10))
        .await;
    let t = app.tenant("ann", "10").await;
    let id = run_script(&t.client, "echo hello; echo world").await;
    t.client.wait_status(&id, "stopped", MINUTE).await;
    let path = format!("/api/v1/reservations/{id}/logs");
    let (_, all, next) = t.client.get_bytes(&path, "x-log-next-offset").await;
    let (_, _, kind) = t.client.get_bytes(&path, "content-type").await;
    let (_, _, sniff) = t.client.get_bytes(&path, "x-content-type-options").await;
    assert_eq!(
        (kind.as_deref(), sniff.as_deref()),
        (Some("text/plain"), Some("nosniff"))
    );
    assert_eq!(
        (all.as_slice(), next.as_deref()),
        (&b"hello\nworld\n"[..], Some("12"))
    );
    for offset in [1_usize, 5, 6, 11, 12] {
        let (status, part, next) = t
            .client
            .get_bytes(&format!("{path}?offset={offset}"), "x-log-next-offset")
            .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            (String::from_utf8_lossy(&part).into_owned(), next),
            (
                String::from_utf8_lossy(&all[offset..]).into_owned(),
                Some("12".to_owned())
            ),
            "?offset={offset}"
        );
    }
    let (status, past, next) = t
        .client
        .get_bytes(&format!("{path}?offset=100"), "x-log-next-offset")
        .await;
    assert_eq!(
        (status, past.len(), next.as_deref()),
        (StatusCode::OK, 0, Some("100"))
    );
    app.shutdown().await;
}
both_stores!(offset_exact, an_offset_reads_from_that_byte);

/// Lines of one run: `run EPOCH: line N`, three of them after a first.
fn run_lines(epoch: i64) -> String {
    let mut s = format!("run {epoch}: begins\n");
    for i in 1..=3 {
        s.push_str(&format!("run {epoch}: line {i}\n"));
    }
    s
}

async fn each_epoch_once_and_in_order(backend: Backend) {
    let mut app = TestApp::with(backend)
        .with_manual_clock()
        .with_liveness(Duration::from_secs(2), 3)
        .start()
        .await;
    app.add_process_node("proc-node", Duration::from_secs(3))
        .await;
    let t = app.tenant("ann", "10").await;
    // It takes its grace period to stop (SIGTERM ignored): the stale epoch is still there
    // while the next one is wanted.
    let id = run_script(
        &t.client,
        "trap '' TERM; echo \"run $GPURENT_EPOCH: begins\"; for i in 1 2 3; do echo \"run $GPURENT_EPOCH: line $i\"; done; exec sleep 300",
    )
    .await;
    let first = run_lines(1);
    app.eventually("the first run's output", || async {
        t.client.whole_log(&id).await == first.as_bytes()
    })
    .await;
    // The agent dies (kill -9); its instance runs on. The node is fenced, the reservation
    // queued again; the agent comes back and runs the next epoch beside the stale one.
    app.kill_agent("proc-node").await;
    app.advance(chrono::Duration::seconds(7));
    app.maintenance_tick().await;
    t.client.wait_status(&id, "pending", MINUTE).await;
    app.restart_agent("proc-node").await;
    app.eventually("the second epoch to run", || async {
        app.maintenance_tick().await;
        let (_, r) = t.client.get(&format!("/api/v1/reservations/{id}")).await;
        r["status"] == "running" && r["epoch"] == 2
    })
    .await;
    let expected = format!("{first}{}", run_lines(2));
    let mut log = Vec::new();
    for _ in 0..400 {
        log = t.client.whole_log(&id).await;
        if log.len() >= expected.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        String::from_utf8_lossy(&log),
        expected,
        "each run once, in order"
    );
    // And nothing more comes of either.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        String::from_utf8_lossy(&t.client.whole_log(&id).await),
        expected
    );
    t.client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    t.client.wait_status(&id, "stopped", MINUTE).await;
    app.shutdown().await;
}
both_stores!(epochs_in_order, each_epoch_once_and_in_order);

async fn logs_are_pruned_after_their_retention(backend: Backend) {
    let mut app = TestApp::with(backend).with_manual_clock().start().await;
    app.add_process_node("proc-node", Duration::from_secs(1))
        .await;
    let t = app.tenant("ann", "10").await;
    let id = run_script(&t.client, "echo old output").await;
    t.client.wait_status(&id, "stopped", MINUTE).await;
    // Downloadable in whole until its retention (30 days by default) is over...
    app.advance(chrono::Duration::days(29));
    app.maintenance_tick().await;
    assert_eq!(t.client.whole_log(&id).await, b"old output\n");
    // ...then pruned.
    app.advance(chrono::Duration::days(2));
    app.maintenance_tick().await;
    assert_eq!(
        String::from_utf8_lossy(&t.client.whole_log(&id).await),
        "",
        "the log of a reservation that ended 31 days ago"
    );
    app.shutdown().await;
}
both_stores!(retention, logs_are_pruned_after_their_retention);
