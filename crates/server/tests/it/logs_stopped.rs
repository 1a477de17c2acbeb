//! The output an instance writes just before it is stopped (issue 14): what it printed since
//! the last sync and during its grace period is shipped before its stop is reported, with the
//! process executor and the Docker executor, through the real agent; and the output kept for
//! that is gone once the report is answered, also when the agent died in between.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpurent_agent::executor::{DockerExecutor, ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::Executor;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

/// Shipping megabytes of output takes some heartbeats.
const MINUTE: Duration = Duration::from_secs(60);

/// Prints `started`, then waits to be stopped, and says its last words in its TERM trap.
const LAST_WORDS: &str =
    "trap 'echo LAST-WORDS; exit 0' TERM; echo started; while :; do sleep 0.1; done";

/// 300 KiB: more than the agent ships of a running instance in one sync.
const BIG: usize = 300 * 1024;

/// Prints 300 KiB and its last words in its TERM trap, half a second after it was told (the
/// agent has synced meanwhile, and seen it still run).
fn big_last_words() -> String {
    format!(
        "trap 'sleep 0.5; head -c {BIG} /dev/zero | tr \"\\0\" y; echo; echo LAST-WORDS; exit 0' TERM; echo started; while :; do sleep 0.1; done"
    )
}

fn big_expected() -> Vec<u8> {
    let mut expected = b"started\n".to_vec();
    expected.extend(std::iter::repeat_n(b'y', BIG));
    expected.extend_from_slice(b"\nLAST-WORDS\n");
    expected
}

async fn reserve(client: &Client, image: Option<&str>, script: &str) -> String {
    let mut body = json!({"gpu_type": "rtx4090", "hours": 1, "command": ["sh", "-c", script]});
    if let Some(image) = image {
        body["image"] = json!(image);
    }
    let (status, r) = client.reserve(body).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    r["id"].as_str().expect("id").to_owned()
}

async fn status_of(client: &Client, id: &str) -> Value {
    client.get(&format!("/api/v1/reservations/{id}")).await.1
}

fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let start = text.len().saturating_sub(80);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    format!("{} bytes, ending {:?}", bytes.len(), &text[start..])
}

/// The log less the shell's `Terminated` lines (dash says so of a `sleep` the stop's SIGTERM
/// killed, before the trap runs): what the script itself printed.
fn printed(log: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(log.len());
    for line in log.split_inclusive(|&b| b == b'\n') {
        if line != b"Terminated\n" {
            out.extend_from_slice(line);
        }
    }
    out
}

/// Waits until the log has begun (`started`), then the tenant stops the reservation; returns
/// its log once it is `stopped`.
async fn stop_and_read(client: &Client, id: &str) -> Vec<u8> {
    client.wait_status(id, "running", MINUTE).await;
    for _ in 0..600 {
        if client.whole_log(id).await.starts_with(b"started") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, r) = client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert!(status.is_success(), "{status}: {r}");
    let r = client.wait_status(id, "stopped", MINUTE).await;
    assert_ne!(r["end_reason"], "exited", "{r}");
    printed(&client.whole_log(id).await)
}

/// What is left in the process executor's `instances` dir.
fn leftovers(data_dir: &Path) -> Vec<String> {
    std::fs::read_dir(data_dir.join("instances"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (up to ten seconds) until the instances dir is empty: the agent forgets what it kept
/// once its report is answered, a moment after the control plane took it.
async fn no_leftovers(data_dir: &Path) {
    for _ in 0..200 {
        if leftovers(data_dir).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("left in the instances dir: {:?}", leftovers(data_dir));
}

async fn last_words_are_kept(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    let dir = app
        .add_process_node("proc-node", Duration::from_secs(10))
        .await;
    let t = app.tenant("ann", "10").await;
    let id = reserve(&t.client, None, LAST_WORDS).await;
    let log = stop_and_read(&t.client, &id).await;
    assert!(
        log == b"started\nLAST-WORDS\n",
        "the log of a stopped instance: {}",
        show(&log)
    );
    no_leftovers(&dir).await;
    app.shutdown().await;
}
both_stores!(last_words, last_words_are_kept);

async fn output_of_the_grace_period_is_kept(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    let dir = app
        .add_process_node("proc-node", Duration::from_secs(10))
        .await;
    let t = app.tenant("ann", "10").await;
    let id = reserve(&t.client, None, &big_last_words()).await;
    let log = stop_and_read(&t.client, &id).await;
    assert!(
        log == big_expected(),
        "the log of a stopped instance: {}",
        show(&log)
    );
    no_leftovers(&dir).await;
    app.shutdown().await;
}
both_stores!(grace_output, output_of_the_grace_period_is_kept);

/// The cap per reservation, and what is kept of the end of a run past it.
const CAP: usize = 16 * 1024 * 1024;
const TAIL: usize = 64 * 1024;

/// Past the cap, a stopped instance's log is its head, the gap marker and its last 64 KiB,
/// which end with what it said in its TERM trap.
async fn past_the_cap_a_stopped_instance_keeps_its_tail(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    let dir = app
        .add_process_node("proc-node", Duration::from_secs(10))
        .await;
    let t = app.tenant("ann", "10").await;
    // 17 MiB of 'x', then it waits to be stopped.
    let id = reserve(
        &t.client,
        None,
        "trap 'echo LAST-WORDS; exit 0' TERM; head -c 17825792 /dev/zero | tr '\\0' x; echo; while :; do sleep 0.1; done",
    )
    .await;
    t.client.wait_status(&id, "running", MINUTE).await;
    // Until the head is full (shipping 16 MiB takes a while).
    let mut shipped = 0;
    for _ in 0..1200 {
        shipped = t.client.whole_log(&id).await.len();
        if shipped >= CAP - TAIL {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        shipped >= CAP - TAIL,
        "the head never filled: {shipped} bytes"
    );
    let (status, r) = t
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert!(status.is_success(), "{status}: {r}");
    t.client.wait_status(&id, "stopped", MINUTE).await;
    let log = t.client.whole_log(&id).await;
    let text = String::from_utf8_lossy(&log);
    assert!(
        String::from_utf8_lossy(&printed(&log)).ends_with("x\nLAST-WORDS\n"),
        "the log: {}",
        show(&log)
    );
    let marker = text
        .find("[gpurent:")
        .unwrap_or_else(|| panic!("no gap marker in the log: {}", show(&log)));
    let after = marker + text[marker..].find('\n').expect("the marker's line") + 1;
    assert_eq!(log.len() - after, TAIL, "the tail kept");
    assert!(log.len() <= CAP + 200, "{} bytes kept in all", log.len());
    no_leftovers(&dir).await;
    app.shutdown().await;
}
both_stores!(past_the_cap, past_the_cap_a_stopped_instance_keeps_its_tail);

/// The agent stopped the instance and died before it reported (or shipped) anything: the agent
/// that comes back ships what was kept, reports the stop, and leaves nothing behind, nor what
/// was kept of an instance the control plane does not want.
async fn a_restarted_agent_ships_what_a_stop_kept(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    let dir = app
        .add_process_node("proc-node", Duration::from_secs(10))
        .await;
    let t = app.tenant("ann", "10").await;
    let id = reserve(&t.client, None, LAST_WORDS).await;
    t.client.wait_status(&id, "running", MINUTE).await;
    for _ in 0..600 {
        if t.client.whole_log(&id).await.starts_with(b"started") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.kill_agent("proc-node").await;
    let (status, r) = t
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert!(status.is_success(), "{status}: {r}");
    // What the dead agent had begun: the stop itself, by an executor on its data dir.
    let executor = ProcessExecutor::unisolated(&dir, None, ResourcesPerGpu::default())
        .expect("process executor");
    executor.stop(&id, None).await.expect("stop");
    // And an instance the control plane never wanted, stopped as well: what it kept goes.
    let ghost = gpurent_types::agent::Assignment {
        reservation_id: "ghost".into(),
        epoch: 1,
        restart_count: 0,
        array_index: None,
        gpus: vec![],
        vram_mb: None,
        image: None,
        command: vec!["sh".into(), "-c".into(), "echo boo; sleep 30".into()],
        env: Default::default(),
        run: true,
        log_offset: 0,
        stop_grace_s: None,
        checkpoint: false,
        secrets: Default::default(),
        sealed_secrets: None,
        ports: vec![],
        mounts: Vec::new(),
    };
    executor.start(&ghost, None).await.expect("start");
    executor.stop("ghost", None).await.expect("stop");
    assert!(executor.list().await.expect("list").is_empty());
    let mut kept = executor.kept_outputs().await.expect("kept outputs");
    kept.sort();
    let epoch = status_of(&t.client, &id).await["epoch"]
        .as_i64()
        .expect("epoch");
    let mut expected = vec![("ghost".to_owned(), 1), (id.clone(), epoch)];
    expected.sort();
    assert_eq!(kept, expected);
    app.restart_agent("proc-node").await;
    t.client.wait_status(&id, "stopped", MINUTE).await;
    let log = printed(&t.client.whole_log(&id).await);
    assert!(
        log == b"started\nLAST-WORDS\n",
        "the log of an instance stopped before its agent died: {}",
        show(&log)
    );
    no_leftovers(&dir).await;
    app.shutdown().await;
}
both_stores!(restarted_agent, a_restarted_agent_ships_what_a_stop_kept);

const IMAGE: &str = "gpurent-test/busybox:latest";

/// The Docker executor, or None (with the reason printed) where there is no Docker Engine
/// and the run did not ask for one (GPURENT_TEST_DOCKER=0).
async fn docker() -> Option<DockerExecutor> {
    let resources = ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 64,
    };
    match DockerExecutor::connect(resources, false).await {
        Ok(d) => Some(
            d.scoped(&format!("test-{}", std::process::id()))
                .with_grace(10),
        ),
        Err(e) if std::env::var("GPURENT_TEST_DOCKER").as_deref() != Ok("0") => {
            panic!("no Docker Engine answers (GPURENT_TEST_DOCKER=0 skips this test): {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no Docker Engine here ({e})");
            None
        }
    }
}

/// The same with the Docker executor on the real Engine: the last words and the 300 KiB of
/// the grace period are in the log, and no container is left once the stops are reported.
async fn docker_keeps_what_a_stopped_container_said(backend: Backend) {
    let Some(executor) = docker().await else {
        return;
    };
    let executor = Arc::new(executor);
    let mut app = TestApp::with(backend).start().await;
    let gpus = Arc::new(SimGpus::parse("2xRTX4090", "docker-node").expect("spec"));
    app.add_node_running("docker-node", gpus, executor.clone())
        .await;
    let t = app.tenant("ann", "10").await;
    let small = reserve(&t.client, Some(IMAGE), LAST_WORDS).await;
    let big = reserve(&t.client, Some(IMAGE), &big_last_words()).await;
    let log = stop_and_read(&t.client, &small).await;
    assert!(
        log == b"started\nLAST-WORDS\n",
        "the log of a stopped container: {}",
        show(&log)
    );
    let log = stop_and_read(&t.client, &big).await;
    assert!(
        log == big_expected(),
        "the log of a stopped container: {}",
        show(&log)
    );
    let mut left = Vec::new();
    for _ in 0..200 {
        left = executor.kept_outputs().await.expect("kept outputs");
        left.retain(|(r, _)| r == &small || r == &big);
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(left.is_empty(), "containers kept: {left:?}");
    let listed = executor.list().await.expect("list");
    assert!(
        !listed
            .iter()
            .any(|o| o.reservation_id == small || o.reservation_id == big),
        "{listed:?}"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_keeps_what_a_stopped_container_said_sqlite() {
    docker_keeps_what_a_stopped_container_said(Backend::Sqlite).await;
}
