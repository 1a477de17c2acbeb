//! The SSH endpoint's limits on real sockets: a client that never authenticates is
//! disconnected at the auth timeout, and connections over the per-address cap are closed at
//! once, before any SSH is spoken.

use std::time::Duration;

use gpurent_server::ssh::{SshLimits, SshServer};
use gpurent_store::Backend;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::app::TestApp;

/// Reads until the server closes the connection, or `deadline` passes: what was read, and
/// whether it was closed.
async fn read_until_closed(stream: &mut TcpStream, deadline: Duration) -> (String, bool) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + deadline;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&seen).into_owned(), true),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&seen).into_owned(), false),
        }
    }
}

async fn start(limits: SshLimits) -> (TestApp, SshServer, tempfile::TempDir) {
    let app = TestApp::with(Backend::Sqlite).start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = app.server.as_ref().unwrap().state.clone();
    let ssh = SshServer::start("127.0.0.1:0".parse().unwrap(), dir.path(), state, limits)
        .await
        .unwrap();
    (app, ssh, dir)
}

#[tokio::test]
async fn a_client_that_never_authenticates_is_disconnected() {
    let limits = SshLimits {
        auth_timeout: Duration::from_secs(1),
        ..SshLimits::default()
    };
    let (_app, ssh, _dir) = start(limits).await;
    // Connected, and silent: no SSH id of its own, no key exchange.
    let mut silent = TcpStream::connect(ssh.addr).await.unwrap();
    let (seen, closed) = read_until_closed(&mut silent, Duration::from_secs(60)).await;
    assert!(seen.starts_with("SSH-2.0-gpurent"), "{seen:?}");
    assert!(
        closed,
        "a silent client still held its connection after 60 s"
    );
    ssh.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_per_address_cap_are_closed() {
    let limits = SshLimits {
        max_connections_per_ip: 2,
        ..SshLimits::default()
    };
    let (_app, ssh, _dir) = start(limits).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(ssh.addr).await.unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
            .await
            .expect("the SSH id within 30 s")
            .unwrap();
        assert!(buf[..n].starts_with(b"SSH-2.0-gpurent"), "{:?}", &buf[..n]);
        held.push(stream);
    }
    let mut third = TcpStream::connect(ssh.addr).await.unwrap();
    let (seen, closed) = read_until_closed(&mut third, Duration::from_secs(30)).await;
    assert!(
        closed && seen.is_empty(),
        "over the cap: {seen:?}, closed: {closed}"
    );
    // A place is given back when a held connection closes.
    drop(held.pop());
    let mut stream = None;
    for _ in 0..300 {
        let mut s = TcpStream::connect(ssh.addr).await.unwrap();
        let mut buf = [0u8; 64];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            if buf[..n].starts_with(b"SSH-2.0-gpurent") {
                stream = Some(s);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        stream.is_some(),
        "no place given back after a connection closed"
    );
    ssh.shutdown().await;
}
