//! What the entry tests share: executors of each kind (or None, saying why, where this host
//! has none), instances started and stopped by guards, and the sessions every executor must
//! pass (exit statuses and signals, a PTY shell, stdin streamed, TCP to a server inside).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpurent_agent::executor::{DockerExecutor, Isolation, ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::{Entered, EntryError, EntryKind, EntryRequest, Executor, ExitStatus, Pty};
use gpurent_types::agent::Assignment;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::support::wait_for;

pub(crate) const IMAGE: &str = "gpurent-test/busybox:latest";
/// An image with one file, a static busybox at `/busybox`: no `/bin/sh`.
pub(crate) const NO_SHELL_IMAGE: &str = "gpurent-test/no-shell:latest";
pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup/gpurent-test";
/// How long a test waits for what it expects before it fails.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

pub(crate) fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{n:x}")
}

pub(crate) fn assignment(id: &str, image: Option<&str>, command: Vec<String>) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch: 1,
        restart_count: 0,
        array_index: None,
        gpus: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
        vram_mb: None,
        image: image.map(str::to_owned),
        command,
        env: [("MODEL".to_owned(), "llama".to_owned())].into(),
        run: true,
        log_offset: 0,
        stop_grace_s: None,
        checkpoint: false,
        secrets: gpurent_types::agent::Secrets(
            [("HF_TOKEN".to_owned(), "s3cret".to_owned())].into(),
        ),
        sealed_secrets: None,
        ports: vec![],
        mounts: Vec::new(),
    }
}

pub(crate) fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

pub(crate) fn exec(command: &str) -> EntryRequest {
    EntryRequest {
        kind: EntryKind::Exec {
            command: command.to_owned(),
        },
        pty: None,
        env: vec![],
    }
}

pub(crate) fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// An isolating process executor, or None (saying why) where this host cannot isolate.
pub(crate) fn process_executor(data_dir: &Path, uid_base: u32) -> Option<Arc<ProcessExecutor>> {
    let isolation = Isolation {
        cgroup_root: CGROUP_ROOT.into(),
        uid_base,
        allow_unisolated: false,
        hidden: vec![],
    };
    match ProcessExecutor::isolated(data_dir, &isolation, ResourcesPerGpu::default()) {
        Ok(e) => Some(Arc::new(e.with_grace(Duration::from_secs(1)))),
        Err(e)
            if !running_as_root()
                || std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") =>
        {
            eprintln!("SKIPPED: no isolation here: {e}");
            None
        }
        Err(e) => panic!("root, yet no isolation (GPURENT_TEST_ISOLATION=0 skips): {e}"),
    }
}

/// The Docker executor, or None (saying why) where no Engine answers and none was asked for.
pub(crate) async fn docker_executor() -> Option<DockerExecutor> {
    let resources = ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 64,
    };
    match DockerExecutor::connect(resources, false).await {
        Ok(d) => Some(
            d.scoped(&format!("test-{}", std::process::id()))
                .with_grace(1),
        ),
        Err(e) if std::env::var("GPURENT_TEST_DOCKER").as_deref() == Ok("1") => {
            panic!("GPURENT_TEST_DOCKER=1 but no Docker Engine answers: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no Docker Engine here ({e}); scripts/test.sh starts one");
            None
        }
    }
}

/// Stops a process instance when dropped, even when the test failed (on a thread of its
/// own: the test's runtime may be the one unwinding).
pub(crate) struct StopOnDrop(pub(crate) Arc<ProcessExecutor>, pub(crate) String);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let (e, id) = (self.0.clone(), self.1.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(e.stop(&id, Some(Duration::ZERO)));
            }
        })
        .join();
    }
}

/// Removes a container when dropped.
pub(crate) struct RemoveOnDrop(pub(crate) String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Starts a process instance whose script writes its uid to `ready` in its directory, and
/// waits for it: (the uid, the guard).
pub(crate) async fn start_process(
    e: &Arc<ProcessExecutor>,
    id: &str,
    script: &str,
) -> (u32, StopOnDrop) {
    let guard = StopOnDrop(e.clone(), id.to_owned());
    let script = format!("id -u > ready.tmp && mv ready.tmp ready; {script}");
    e.start(&assignment(id, None, sh(&script)), None)
        .await
        .unwrap();
    let ready = e.home_path(id).join("ready");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(uid) = std::fs::read_to_string(&ready)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return (uid, guard);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the instance never wrote {}; its output: {:?}",
            ready.display(),
            std::fs::read_to_string(e.output_path(id))
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn start_container(
    e: &DockerExecutor,
    id: &str,
    image: &str,
    command: Vec<String>,
) -> RemoveOnDrop {
    let guard = RemoveOnDrop(gpurent_agent::executor::docker::container_name(id));
    e.start(&assignment(id, Some(image), command), None)
        .await
        .unwrap();
    wait_for(e, id, ObservedState::Running).await;
    guard
}

/// Reads from `out` into `seen` until it holds `want` (fails after PATIENCE with what came).
pub(crate) async fn read_until(
    out: &mut (dyn AsyncRead + Send + Unpin),
    seen: &mut String,
    want: &str,
) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut buf = [0u8; 4096];
    while !seen.contains(want) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, out.read(&mut buf)).await {
            Ok(Ok(0)) => panic!("the session's output ended before {want:?}; it was: {seen:?}"),
            Ok(Ok(n)) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Ok(Err(e)) => panic!("reading the session's output: {e}; it was: {seen:?}"),
            Err(_) => panic!("no {want:?} within {PATIENCE:?}; the output was: {seen:?}"),
        }
    }
}

/// Everything a session writes to stdout and stderr, and how it ended.
pub(crate) async fn run_to_end(mut s: Entered) -> (String, String, ExitStatus) {
    s.stdin.shutdown().await.unwrap();
    let mut stderr = s.stderr.take();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let read_out = s.stdout.read_to_end(&mut out);
    let read_err = async {
        if let Some(e) = stderr.as_mut() {
            e.read_to_end(&mut err).await.unwrap();
        }
    };
    let (r, ()) = tokio::time::timeout(PATIENCE, async { tokio::join!(read_out, read_err) })
        .await
        .expect("the session never ended");
    r.unwrap();
    let status = tokio::time::timeout(PATIENCE, s.control.wait())
        .await
        .expect("no exit status")
        .unwrap();
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
        status,
    )
}

pub(crate) async fn enter(e: &dyn Executor, id: &str, request: EntryRequest) -> Entered {
    match e.enter(id, request).await {
        Ok(s) => s,
        Err(err) => panic!("cannot enter {id}: {err}"),
    }
}

/// Exit codes and signals, and the signal of a `signal` request.
pub(crate) async fn exit_statuses(e: &dyn Executor, id: &str, killed: ExitStatus) {
    let (_, _, status) =
        run_to_end(enter(e, id, exec("echo out; echo err >&2; exit 3")).await).await;
    assert_eq!(status, ExitStatus::Code(3));
    let (out, err, _) = run_to_end(enter(e, id, exec("echo out; echo err >&2")).await).await;
    assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
    let (_, _, status) = run_to_end(enter(e, id, exec("kill -TERM $$")).await).await;
    assert_eq!(status, killed, "a shell that killed itself with SIGTERM");
    // A signal request reaches the command.
    let mut s = enter(e, id, exec("echo started; sleep 4000")).await;
    let mut seen = String::new();
    read_until(&mut *s.stdout, &mut seen, "started").await;
    s.control.signal("TERM").await.unwrap();
    let status = tokio::time::timeout(PATIENCE, s.control.wait())
        .await
        .expect("the signalled command never ended")
        .unwrap();
    assert_eq!(status, killed, "a command sent SIGTERM");
}

/// The process with exactly this command line, if one runs on the node.
pub(crate) fn pid_of(cmdline: &str) -> Option<u32> {
    let want: Vec<u8> = cmdline
        .split(' ')
        .flat_map(|w| w.bytes().chain([0]))
        .collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|p| std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == want))
        .find_map(|p| p.file_name().to_str()?.parse().ok())
}

/// Whether a process with exactly this command line runs on the node.
pub(crate) fn running(cmdline: &str) -> bool {
    pid_of(cmdline).is_some()
}

/// A login shell with a PTY: its size, a resize, ^C of a foreground `sleep`; the terminal
/// belongs to `owner` where given.
pub(crate) async fn pty_shell(
    e: &dyn Executor,
    id: &str,
    stty: &str,
    sleep: &str,
    owner: Option<u32>,
) {
    let request = EntryRequest {
        kind: EntryKind::Shell,
        pty: Some(Pty {
            term: "xterm-256color".into(),
            cols: 91,
            rows: 27,
        }),
        env: vec![],
    };
    let mut s = enter(e, id, request).await;
    assert!(s.stderr.is_none(), "a PTY has no stderr of its own");
    let mut seen = String::new();
    s.stdin
        .write_all(format!("{stty} size; echo \"term=$TERM\"\n").as_bytes())
        .await
        .unwrap();
    read_until(&mut *s.stdout, &mut seen, "27 91").await;
    read_until(&mut *s.stdout, &mut seen, "term=xterm-256color").await;
    if let Some(uid) = owner {
        s.stdin
            .write_all(b"stat -L -c owner=%u /proc/self/fd/0\n")
            .await
            .unwrap();
        read_until(&mut *s.stdout, &mut seen, &format!("owner={uid}")).await;
    }
    s.control.resize(120, 40).await.unwrap();
    s.stdin
        .write_all(format!("{stty} size\n").as_bytes())
        .await
        .unwrap();
    read_until(&mut *s.stdout, &mut seen, "40 120").await;
    s.stdin
        .write_all(format!("{sleep}\n").as_bytes())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !running(sleep) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{sleep} never started: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.stdin.write_all(b"\x03").await.unwrap();
    s.stdin.write_all(b"echo done-$((40+2))\n").await.unwrap();
    // Only the shell's arithmetic prints 42; before the sleep ended nothing would.
    read_until(&mut *s.stdout, &mut seen, "done-42").await;
    assert!(!running(sleep), "^C did not end {sleep}");
    s.stdin.write_all(b"exit 5\n").await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, s.stdout.read_to_end(&mut rest)).await;
    let status = tokio::time::timeout(PATIENCE, s.control.wait())
        .await
        .expect("the shell never ended")
        .unwrap();
    assert_eq!(status, ExitStatus::Code(5));
}

/// 1 MiB through `cat` and back, written while it is read (back-pressure both ways).
pub(crate) async fn stdin_streamed(e: &dyn Executor, id: &str) {
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| i.wrapping_mul(2_654_435_761).to_be_bytes()[1])
        .collect();
    let want = Sha256::digest(&data);
    let mut s = enter(e, id, exec("cat")).await;
    let mut stdin = s.stdin;
    // The relay keeps stdin after the client's EOF: its shutdown alone must end `cat`.
    let writer = tokio::spawn(async move {
        stdin.write_all(&data).await.unwrap();
        stdin.shutdown().await.unwrap();
        stdin
    });
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, s.stdout.read_to_end(&mut out))
        .await
        .expect("cat never ended")
        .unwrap();
    let _kept = writer.await.unwrap();
    assert_eq!(out.len(), 1 << 20);
    assert_eq!(Sha256::digest(&out), want, "what came back differs");
    assert_eq!(s.control.wait().await.unwrap(), ExitStatus::Code(0));
}

/// A connection to `busybox httpd` in the instance on `port`.
pub(crate) async fn tcp_to_httpd(e: &dyn Executor, id: &str, port: u16) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut s = loop {
        match e
            .enter(
                id,
                EntryRequest {
                    kind: EntryKind::Tcp { port },
                    pty: None,
                    env: vec![],
                },
            )
            .await
        {
            Ok(s) => break s,
            Err(EntryError::NothingListens { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("no connection to port {port}: {err}"),
        }
    };
    s.stdin
        .write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, s.stdout.read_to_end(&mut response))
        .await
        .expect("the server never closed")
        .unwrap();
    let response = String::from_utf8_lossy(&response);
    assert!(response.contains("hello-from-the-instance"), "{response}");
    assert_eq!(s.control.wait().await.unwrap(), ExitStatus::Code(0));
    let closed = free_port();
    let refused = e
        .enter(
            id,
            EntryRequest {
                kind: EntryKind::Tcp { port: closed },
                pty: None,
                env: vec![],
            },
        )
        .await
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        refused,
        Some(format!("nothing listens on port {closed} in the instance"))
    );
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
