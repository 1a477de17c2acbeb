//! The process executor's network per instance, against a hostile tenant: the node's loopback
//! services out of reach (from the workload and from a session in it), no listener of the node
//! in its `ss`, one port for two instances, egress to the node's own address, and no pasta left
//! once an instance ends or is stopped. Needs root, bubblewrap and pasta (`scripts/test.sh`
//! installs them); elsewhere these tests say why they did not run.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpurent_agent::entry::{EntryKind, EntryRequest};
use gpurent_agent::executor::ProcessExecutor;
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::Executor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::entry_support::{
    exec, free_port, process_executor, run_to_end, start_process, unique, PATIENCE,
};
use crate::support::wait_for;

/// An isolating executor whose instances have a network of their own, or None (saying why)
/// where this host cannot isolate; as root, a shared network is a failure.
fn executor(data_dir: &Path, uid_base: u32) -> Option<Arc<ProcessExecutor>> {
    let e = process_executor(data_dir, uid_base)?;
    assert!(
        !e.shares_network(),
        "root and bubblewrap, yet instances share the node's network (install passt: pasta)"
    );
    Some(e)
}

/// What bash in the instance says of a TCP connection to `addr`: `reached` or `refused`.
fn probe_script(addr: SocketAddr) -> String {
    format!(
        "bash -c 'if (exec 3<>/dev/tcp/{}/{}) 2>/dev/null; then echo reached; else echo refused; fi'",
        addr.ip(),
        addr.port()
    )
}

/// The body an HTTP GET of `/` on `port` in the instance answers, through the agent's entry.
async fn get_in_instance(e: &ProcessExecutor, id: &str, port: u16) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut s = loop {
        let request = EntryRequest {
            kind: EntryKind::Tcp { port },
            pty: None,
            env: vec![],
        };
        match e.enter(id, request).await {
            Ok(s) => break s,
            Err(err) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no connection to port {port} of {id}: {err}; its output: {:?}",
                    std::fs::read_to_string(e.output_path(id))
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    };
    s.stdin
        .write_all(b"GET /hello.txt HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, s.stdout.read_to_end(&mut response))
        .await
        .expect("the server never closed")
        .unwrap();
    String::from_utf8_lossy(&response).into_owned()
}

fn http_server(port: u16, body: &str) -> String {
    format!(
        "echo {body} > hello.txt; exec python3 -m http.server {port} --bind 127.0.0.1 --directory /instance"
    )
}

/// The repro: the second instance's server failed with "Address already in use".
#[tokio::test]
async fn network_two_instances_listen_on_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = executor(dir.path(), 371_000) else {
        return;
    };
    let port = free_port();
    let (a, b) = (unique("net-a"), unique("net-b"));
    let (_, _guard_a) = start_process(&e, &a, &http_server(port, "from-a")).await;
    let (_, _guard_b) = start_process(&e, &b, &http_server(port, "from-b")).await;
    let from_a = get_in_instance(&e, &a, port).await;
    let from_b = get_in_instance(&e, &b, port).await;
    assert!(from_a.contains("from-a"), "{from_a}");
    assert!(from_b.contains("from-b"), "{from_b}");
}

/// The repro: `curl 127.0.0.1:PORT` from an instance answered with the control plane, and
/// `ss -ltn` listed every listener of the node.
#[tokio::test]
async fn network_an_instance_cannot_reach_the_node_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = executor(dir.path(), 372_000) else {
        return;
    };
    let node = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    node.set_nonblocking(true).unwrap();
    let addr = node.local_addr().unwrap();
    let id = unique("net-loopback");
    let (_, _guard) = start_process(
        &e,
        &id,
        &format!(
            "{} > probe.out; ss -ltn > listeners.out; echo done >> probe.out; sleep 600",
            probe_script(addr)
        ),
    )
    .await;
    let home = e.home_path(&id);
    let probe = read_when_done(&home.join("probe.out")).await;
    assert!(probe.starts_with("refused"), "{probe}");
    let listeners = std::fs::read_to_string(home.join("listeners.out")).unwrap();
    assert!(
        !listeners.contains(&format!(":{}", addr.port())),
        "the node's listener is in the instance's ss: {listeners}"
    );
    // A session in the instance (ssh) is in its network too.
    let session =
        run_to_end(crate::entry_support::enter(&*e, &id, exec(&probe_script(addr))).await).await;
    assert!(session.0.starts_with("refused"), "{session:?}");
    assert!(
        node.accept().is_err(),
        "the node's loopback listener accepted a connection from the instance"
    );
}

/// Egress: the instance reaches a service on the node's own (non-loopback) address, through
/// pasta, as it would any host's, and has a name server it can reach.
#[tokio::test]
async fn network_an_instance_reaches_the_node_address() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = executor(dir.path(), 373_000) else {
        return;
    };
    let Some(ip) = node_address() else {
        eprintln!("SKIPPED: this node has no non-loopback IPv4 address with a route");
        return;
    };
    let node = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = node.local_addr().unwrap();
    let id = unique("net-egress");
    let (_, _guard) = start_process(
        &e,
        &id,
        &format!(
            "bash -c 'exec 3<>/dev/tcp/{}/{} && echo hello-from-the-instance $(grep -m1 ^nameserver /etc/resolv.conf) >&3 && sleep 600'",
            addr.ip(),
            addr.port()
        ),
    )
    .await;
    let (mut conn, _) = tokio::time::timeout(PATIENCE, node.accept())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no connection from the instance; its output: {:?}",
                std::fs::read_to_string(e.output_path(&id))
            )
        })
        .unwrap();
    let mut line = String::new();
    let mut buf = [0u8; 64];
    while !line.contains('\n') {
        let n = tokio::time::timeout(PATIENCE, conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed after {line:?}");
        line.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    // Its name server is one its own network reaches: never one on the node's loopback
    // (systemd-resolved's stub gives way to the servers it asks).
    let server = line
        .strip_prefix("hello-from-the-instance nameserver ")
        .and_then(|rest| rest.trim().parse::<std::net::IpAddr>().ok())
        .unwrap_or_else(|| panic!("no name server in {line:?}"));
    assert!(!server.is_loopback(), "{line:?}");
}

/// pasta ends with its instance: when the command ends by itself, and when it is stopped (by
/// the agent that started it, or by one restarted since).
#[tokio::test]
async fn network_no_pasta_remains_after_an_instance() {
    let dir = tempfile::tempdir().unwrap();
    let Some(e) = executor(dir.path(), 374_000) else {
        return;
    };
    // Stopped.
    let id = unique("net-stop");
    let (_, guard) = start_process(&e, &id, "sleep 600").await;
    let pasta = pasta_of(&e, &id);
    assert!(alive(pasta), "pasta {pasta} is not running");
    e.stop(&id, None).await.unwrap();
    drop(guard);
    assert!(!alive(pasta), "pasta {pasta} outlived the stop");
    // Stopped by a restarted agent, which adopted the instance.
    let id = unique("net-adopted");
    let (_, guard) = start_process(&e, &id, "sleep 600").await;
    let pasta = pasta_of(&e, &id);
    let restarted = executor(dir.path(), 374_000).unwrap();
    assert_eq!(
        crate::support::state_of(&*restarted, &id).await,
        Some(ObservedState::Running)
    );
    restarted.stop(&id, None).await.unwrap();
    drop(guard);
    assert!(
        !alive(pasta),
        "pasta {pasta} outlived the stop after a restart"
    );
    // Ended by itself: the instance waits for a file the test writes.
    let id = unique("net-end");
    let (_, _guard) = start_process(
        &e,
        &id,
        "while [ ! -e go ]; do sleep 0.05; done; echo ending",
    )
    .await;
    let pasta = pasta_of(&e, &id);
    assert!(alive(pasta), "pasta {pasta} is not running");
    std::fs::write(e.home_path(&id).join("go"), "").unwrap();
    wait_for(&*e, &id, ObservedState::Exited(0)).await;
    assert!(
        !alive(pasta),
        "pasta {pasta} outlived its instance's command"
    );
}

/// The pid of the instance's pasta, from its pid file in the instance's directory.
fn pasta_of(e: &ProcessExecutor, id: &str) -> i32 {
    let file: PathBuf = e.home_path(id).parent().unwrap().join("pasta.pid");
    let pid: i32 = std::fs::read_to_string(&file)
        .unwrap_or_else(|err| panic!("{}: {err}", file.display()))
        .trim()
        .parse()
        .unwrap();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    // pasta runs as itself, or as the build for this CPU it execs (`passt.avx2`).
    assert!(comm.starts_with("pas"), "pid {pid} is not pasta: {comm}");
    pid
}

/// Whether `pid` runs (a zombie does not: it waits for its reaper).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// A file once its last line is `done`.
async fn read_when_done(path: &Path) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.ends_with("done\n") {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never ended with done: {text:?}",
            path.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The node's address on its default route (no packet is sent).
fn node_address() -> Option<IpAddr> {
    let socket = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}
