//! The agent's loop against a stand-in control plane (the sync call, over loopback HTTP) with
//! the process executor: a preempted spot instance gets its grace period while the agent keeps
//! syncing, and the preemptor starts on its GPU only once the spot instance is gone.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpurent_agent::executor::{ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{Agent, AgentConfig, Executor, NodeIdentity, RetryPolicy};
use gpurent_types::agent::{Assignment, InstanceState, SyncRequest};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

/// What the stand-in control plane wants, and every sync it received.
#[derive(Debug, Default)]
pub(crate) struct ControlPlane {
    desired: Mutex<(i64, Vec<Assignment>)>,
    changed: Notify,
    syncs: Mutex<Vec<(Instant, SyncRequest)>>,
}

impl ControlPlane {
    pub(crate) async fn serve() -> (Arc<Self>, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let cp = Arc::new(ControlPlane::default());
        let serving = Arc::clone(&cp);
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(Arc::clone(&serving).answer(conn));
            }
        });
        (cp, base)
    }

    pub(crate) fn set(&self, assignments: Vec<Assignment>) {
        let mut desired = self.desired.lock().unwrap();
        desired.0 += 1;
        desired.1 = assignments;
        self.changed.notify_waiters();
    }

    /// One sync per connection: take the report, hold the answer while the desired state is
    /// the one the agent knows (up to its wait), answer with the desired state.
    async fn answer(self: Arc<Self>, conn: TcpStream) {
        let mut conn = BufReader::new(conn);
        let mut length = 0;
        loop {
            let mut line = String::new();
            conn.read_line(&mut line).await.unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; length];
        conn.read_exact(&mut body).await.unwrap();
        let request: SyncRequest = serde_json::from_slice(&body).unwrap();
        let known = request.known_version;
        let wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
        self.syncs.lock().unwrap().push((Instant::now(), request));
        let changed = self.changed.notified();
        if known == Some(self.desired.lock().unwrap().0) {
            let _ = tokio::time::timeout(wait, changed).await;
        }
        let (version, assignments) = self.desired.lock().unwrap().clone();
        let body = serde_json::json!({
            "node_id": "node-1",
            "version": version,
            "server_time": "2025-01-01T00:00:00Z",
            "assignments": assignments,
        })
        .to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.get_mut().write_all(response.as_bytes()).await.unwrap();
    }

    /// Where in the list of syncs the first one that `check` accepts is, waiting up to 15 s.
    pub(crate) async fn first_sync(
        &self,
        what: &str,
        check: impl Fn(&SyncRequest) -> bool,
    ) -> usize {
        for _ in 0..600 {
            if let Some(i) = self
                .syncs
                .lock()
                .unwrap()
                .iter()
                .position(|(_, r)| check(r))
            {
                return i;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no sync with {what} in 15 s");
    }
}

pub(crate) fn reports(r: &SyncRequest, id: &str, state: InstanceState) -> bool {
    r.instances
        .iter()
        .any(|i| i.reservation_id == id && i.state == state)
}

fn output_has(r: &SyncRequest, id: &str, text: &str) -> bool {
    r.logs.iter().any(|l| {
        l.reservation_id == id
            && String::from_utf8_lossy(&l.bytes().unwrap_or_default()).contains(text)
    })
}

pub(crate) fn assignment(id: &str, gpus: &[&str], script: &str) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch: 1,
        restart_count: 0,
        array_index: None,
        gpus: gpus.iter().map(|g| (*g).to_owned()).collect(),
        vram_mb: None,
        image: None,
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        run: true,
        ports: vec![],
        log_offset: 0,
        stop_grace_s: None,
        checkpoint: false,
        secrets: Default::default(),
        sealed_secrets: None,
        mounts: Vec::new(),
    }
}

#[tokio::test]
async fn a_preempted_instance_gets_its_grace_period_while_the_agent_keeps_syncing() {
    let (cp, base) = ControlPlane::serve().await;
    let dir = tempfile::tempdir().unwrap();
    NodeIdentity {
        node_id: "node-1".into(),
        node_token: "gpn-test".into(),
        name: "node-1".into(),
    }
    .save(dir.path())
    .unwrap();
    let heartbeat = Duration::from_millis(200);
    let mut config = AgentConfig::new(&base, dir.path().to_owned(), "node-1");
    config.heartbeat = heartbeat;
    config.retry = RetryPolicy {
        tries: 3,
        delay: Duration::from_millis(100),
    };
    // The assignment's grace (3 s) is what counts, not this default.
    let executor = Arc::new(
        ProcessExecutor::unisolated(dir.path(), None, ResourcesPerGpu::default())
            .unwrap()
            .with_grace(Duration::from_secs(60)),
    );
    let gpus = Arc::new(SimGpus::parse("2xRTX4090", "node-1").unwrap());

    let mut spot = assignment(
        "spot",
        &["GPU-0"],
        "trap 'echo got-term' TERM; echo ready; while true; do sleep 0.1; done",
    );
    cp.set(vec![spot.clone()]);
    let (shutdown, stopped) = watch::channel(false);
    let agent = tokio::spawn(Agent::new(config, gpus, executor.clone()).run(stopped));
    cp.first_sync("spot running", |r| {
        reports(r, "spot", InstanceState::Running) && output_has(r, "spot", "ready")
    })
    .await;

    // Preemption: the spot instance is to stop within 3 s, its GPU goes to the preemptor.
    spot.run = false;
    spot.stop_grace_s = Some(3);
    let preemptor = assignment("pre", &["GPU-0", "GPU-1"], "echo started; sleep 300");
    let preempted_at = Instant::now();
    cp.set(vec![spot, preemptor.clone()]);
    let gone = cp
        .first_sync("spot stopped", |r| {
            reports(r, "spot", InstanceState::Stopped)
        })
        .await;
    // As the control plane does once it hears so, the spot reservation is let go.
    cp.set(vec![preemptor]);
    let started = cp
        .first_sync("the preemptor running", |r| {
            reports(r, "pre", InstanceState::Running)
        })
        .await;

    let syncs: Vec<(Instant, SyncRequest)> = std::mem::take(&mut *cp.syncs.lock().unwrap());
    let stopped_at = syncs[gone].0;
    assert!(
        stopped_at - preempted_at >= Duration::from_millis(2500),
        "the spot instance was stopped within {:?}, before its grace period was over",
        stopped_at - preempted_at
    );
    assert!(
        syncs[..gone]
            .iter()
            .any(|(_, r)| output_has(r, "spot", "got-term")),
        "the spot instance was not told by SIGTERM"
    );
    // The agent kept syncing through the grace period: no gap near the grace period (3 s)
    // between two syncs, where the heartbeat is 200 ms.
    let during: Vec<Instant> = syncs
        .iter()
        .map(|(at, _)| *at)
        .filter(|at| *at >= preempted_at && *at <= stopped_at)
        .collect();
    let longest = during
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    assert!(
        during.len() >= 4 && longest < Duration::from_millis(1500),
        "{} syncs during the grace period, the longest gap {longest:?}",
        during.len()
    );
    // The preemptor did not run beside the spot instance: nothing of it was reported before
    // the spot instance was gone.
    assert!(started > gone);
    assert!(syncs[..=gone]
        .iter()
        .all(|(_, r)| r.instances.iter().all(|i| i.reservation_id != "pre")));

    shutdown.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    executor
        .stop("pre", Some(Duration::from_secs(1)))
        .await
        .unwrap();
}
