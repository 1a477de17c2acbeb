//! Slow and greedy clients on real loopback sockets: half-sent headers, silent and idle
//! keep-alive connections and stalled bodies are closed after their timeouts, connections
//! beyond the caps are refused at once, and meanwhile the API keeps serving its tenants.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gpurent_server::ServerConfig;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

use crate::app::TestApp;

/// The header, body and idle timeouts of the timeout tests: short, so the test is too.
const SHORT: Duration = Duration::from_secs(1);
/// How long a socket may take to be closed after its timeout, on a noisy machine.
const CLOSE_DEADLINE: Duration = Duration::from_secs(30);
const HALF_HEADER: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: gpurent\r\nAccept: */*\r\n";

fn short_timeouts(config: &mut ServerConfig) {
    config.http.header_timeout = SHORT;
    config.http.body_timeout = SHORT;
    config.http.idle_timeout = SHORT;
}

fn small_caps(config: &mut ServerConfig) {
    config.http.max_connections = Some(20);
    config.http.max_connections_per_ip = Some(8);
}

/// The address a slow client connects from: all of 127.0.0.0/8 is loopback, so each test's
/// clients come from addresses of their own, apart from the tenant's 127.0.0.1.
fn client_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

async fn connect_from(ip: Ipv4Addr, server: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((ip, 0)))?;
    socket.connect(server).await
}

/// A tenant and their token, for requests written by hand.
async fn tenant(app: &TestApp, name: &str) -> (crate::app::Client, String) {
    let (status, body) = app
        .admin()
        .post(
            "/api/v1/users",
            &json!({"name": name, "role": "tenant", "credit": "100"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let token = body["token"].as_str().expect("token").to_owned();
    (app.client(Some(&token)), token)
}

/// `/healthz` and a tenant's offers are answered.
async fn api_serves(app: &TestApp, alice: &crate::app::Client) {
    let (status, body) = app.anonymous().get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "healthz: {body}");
    let (status, body) = alice.get("/api/v1/offers").await;
    assert_eq!(status, StatusCode::OK, "offers: {body}");
}

/// As `api_serves`, within a bound (a server out of file descriptors never answers).
async fn served_within(app: &TestApp, alice: &crate::app::Client) {
    let bound = Duration::from_secs(30);
    tokio::time::timeout(bound, api_serves(app, alice))
        .await
        .unwrap_or_else(|_| panic!("/healthz and offers not answered within {bound:?}"));
}

/// One sample of the server's `/metrics`.
async fn metric(app: &TestApp, series: &str) -> u64 {
    let (status, text, _) = app.admin().get_text("/metrics", "content-type").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

/// Reads one response (head and `Content-Length` body) off a connection.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.expect("read response");
        assert!(n > 0, "closed before a whole response: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().expect("length"))
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return text;
            }
        }
    }
}

/// Whatever the server sends until it closes the connection, or `None` if it is still open
/// at the deadline.
async fn until_closed(mut stream: TcpStream, deadline: Duration) -> Option<String> {
    let mut seen = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(deadline, read).await.ok()?;
    Some(String::from_utf8_lossy(&seen).into_owned())
}

/// True when the server has not closed the connection (nor sent anything) within `wait`.
async fn still_open(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    tokio::time::timeout(wait, stream.read(&mut byte))
        .await
        .is_err()
}

/// Waits for each connection to be closed; says how many were still open at the deadline.
async fn closed(kind: &str, streams: Vec<TcpStream>) -> (usize, Vec<String>) {
    let count = streams.len();
    let waits: Vec<_> = streams
        .into_iter()
        .map(|s| tokio::spawn(until_closed(s, CLOSE_DEADLINE)))
        .collect();
    let mut open = 0;
    let mut answers = Vec::new();
    for w in waits {
        match w.await.expect("join") {
            Some(answer) => answers.push(answer),
            None => open += 1,
        }
    }
    eprintln!("{kind}: {open} of {count} still open after {CLOSE_DEADLINE:?}");
    (open, answers)
}

async fn slow_clients_are_closed_after_their_timeouts() {
    let app = TestApp::with(Backend::Sqlite)
        .with_config(short_timeouts)
        .start()
        .await;
    let server = app.server.as_ref().expect("running").addr;
    let (alice, token) = tenant(&app, "alice").await;
    const EACH: usize = 50;

    let mut half = Vec::new();
    let mut silent = Vec::new();
    let mut idle = Vec::new();
    let mut stalled = Vec::new();
    for _ in 0..EACH {
        let mut s = connect_from(client_ip(2), server).await.expect("connect");
        s.write_all(HALF_HEADER).await.expect("write");
        half.push(s);
        silent.push(connect_from(client_ip(3), server).await.expect("connect"));
        // One request answered, then the connection kept alive and left idle.
        let mut s = connect_from(client_ip(4), server).await.expect("connect");
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: gpurent\r\n\r\n")
            .await
            .expect("write");
        let answer = read_response(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        idle.push(s);
        // A body declared 60,000 bytes long of which 12 are sent.
        let mut s = connect_from(client_ip(5), server).await.expect("connect");
        let head = format!(
            "POST /api/v1/reservations HTTP/1.1\r\nHost: gpurent\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n{{\"gpus\": 1, "
        );
        s.write_all(head.as_bytes()).await.expect("write");
        stalled.push(s);
    }
    // Held meanwhile, they keep nobody else out.
    api_serves(&app, &alice).await;

    let (half, silent, idle, (stalled_open, answers)) = tokio::join!(
        closed("half a header", half),
        closed("no request", silent),
        closed("idle keep-alive", idle),
        closed("stalled body", stalled),
    );
    assert_eq!(
        (half.0, silent.0, idle.0, stalled_open),
        (0, 0, 0, 0),
        "sockets (half a header, no request, idle, stalled body) still open {CLOSE_DEADLINE:?} \
         after {SHORT:?} timeouts"
    );
    // The stalled body is told why.
    assert!(
        answers.iter().all(|a| a.starts_with("HTTP/1.1 408")),
        "{:?}",
        answers.first()
    );
    api_serves(&app, &alice).await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_closed() {
    slow_clients_are_closed_after_their_timeouts().await;
}

/// A request the handler works on for longer than every timeout (an agent's long poll) is
/// answered, and so is a body sent slowly but steadily.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_outlive_the_timeouts() {
    let app = TestApp::with(Backend::Sqlite)
        .with_config(short_timeouts)
        .start()
        .await;
    let (agent, sync) = app.node_by_hand("poller").await;
    let (status, first) = agent.post("/api/v1/agent/sync", &sync).await;
    assert_eq!(status, StatusCode::OK, "{first}");

    // Nothing changes: the server holds the answer for the whole wait, three timeouts long.
    let wait = SHORT * 3;
    let mut poll = sync.clone();
    poll["known_version"] = first["version"].clone();
    poll["wait_ms"] = json!(wait.as_millis());
    for _ in 0..2 {
        let started = Instant::now();
        let (status, body) = agent.post("/api/v1/agent/sync", &poll).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            started.elapsed() >= wait,
            "answered before the wait was over"
        );
    }

    // A body sent slowly but steadily (a KiB each 300 ms), longer in all than the body timeout:
    // each KiB received earns it a second.
    let (_, token) = tenant(&app, "bob").await;
    let server = app.server.as_ref().expect("running").addr;
    let mut s = connect_from(client_ip(6), server).await.expect("connect");
    let mut body = vec![b' '; 4 * 1024];
    body.extend_from_slice(br#"{"name": "slow-but-steady", "expires_in_days": 1}"#);
    let head = format!(
        "POST /api/v1/tokens HTTP/1.1\r\nHost: gpurent\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let started = Instant::now();
    for piece in body.chunks(1024) {
        tokio::time::sleep(SHORT * 3 / 10).await;
        s.write_all(piece).await.expect("write");
    }
    assert!(
        started.elapsed() > SHORT,
        "sent faster than the body timeout"
    );
    let answer = read_response(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    app.shutdown().await;
}

async fn healthz_on(conn: &mut TcpStream) -> String {
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: gpurent\r\n\r\n")
        .await
        .expect("write");
    read_response(conn).await
}

/// Beyond the caps a connection is answered 503 and closed at once; the ones within the caps
/// stay served, and a closed connection frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_caps_are_refused() {
    let app = TestApp::with(Backend::Sqlite)
        .with_config(small_caps)
        .start()
        .await;
    let server = app.server.as_ref().expect("running").addr;
    // Eight from one address, each served once (so the server surely holds them).
    let mut first = Vec::new();
    for _ in 0..8 {
        let mut s = connect_from(client_ip(2), server).await.expect("connect");
        let answer = healthz_on(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        first.push(s);
    }
    let ninth = connect_from(client_ip(2), server).await.expect("connect");
    let refused = until_closed(ninth, CLOSE_DEADLINE).await;
    let refused = refused.expect("the 9th connection from one address was left open");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("too_many_connections"), "{refused}");
    for s in &mut first {
        assert!(still_open(s, Duration::from_millis(50)).await);
    }
    // Twenty in all: 8 + 8 + 4 from three addresses; then everyone is refused.
    let mut more = Vec::new();
    for n in 0..12 {
        let ip = client_ip(if n < 8 { 3 } else { 4 });
        let mut s = connect_from(ip, server).await.expect("connect");
        let answer = healthz_on(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        more.push(s);
    }
    let other = connect_from(client_ip(5), server).await.expect("connect");
    let refused = until_closed(other, CLOSE_DEADLINE).await;
    let refused = refused.expect("the 21st connection was left open");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    // Served connections carry on.
    let answer = healthz_on(&mut first[0]).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // A place freed is taken again.
    drop(first);
    app.eventually("a freed connection's place to be taken", || async {
        let Ok(mut s) = connect_from(client_ip(5), server).await else {
            return false;
        };
        let mut seen = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: gpurent\r\n\r\n")
                .await?;
            s.read_buf(&mut seen).await
        })
        .await;
        seen.starts_with(b"HTTP/1.1 200")
    })
    .await;
    drop(more);
    app.shutdown().await;
}

const HOLDERS: u8 = 2;
const PER_HOLDER: usize = 10_000;
const HOLD_ENV: &str = "GPURENT_TEST_SLOW_HOLDER";

/// A process of its own holding slow sockets (each process's open files are capped, the
/// test's as well): `N` sockets, each with half a request header sent, from one address.
struct Holder {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Holder {
    fn start(server: SocketAddr, from: Ipv4Addr, count: usize) -> Holder {
        let exe = std::env::current_exe().expect("test binary");
        let mut child = tokio::process::Command::new(exe)
            .args(["slow_clients::holder_process", "--exact", "--nocapture"])
            .env(HOLD_ENV, format!("{server} {from} {count}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start holder");
        let stdout = child.stdout.take().expect("stdout");
        Holder {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The holder's next report (`HOLD ...`), skipping the test harness's lines.
    async fn report(&mut self) -> String {
        while let Some(line) = self.lines.next_line().await.expect("holder output") {
            if let Some(report) = line.strip_prefix("HOLD ") {
                return report.to_owned();
            }
        }
        let status = self.child.wait().await;
        panic!("holder ended without reporting: {status:?}");
    }
}

/// The child of `twenty_thousand_slow_sockets`; does nothing in an ordinary test run.
#[test]
fn holder_process() {
    let Ok(spec) = std::env::var(HOLD_ENV) else {
        return;
    };
    let mut parts = spec.split(' ');
    let server: SocketAddr = parts.next().expect("server").parse().expect("server");
    let from: Ipv4Addr = parts.next().expect("from").parse().expect("from");
    let count: usize = parts.next().expect("count").parse().expect("count");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(hold(server, from, count));
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "HOLD {line}").expect("stdout");
    out.flush().expect("stdout");
}

async fn hold(server: SocketAddr, from: Ipv4Addr, count: usize) {
    use futures::StreamExt;
    let opened: Vec<std::io::Result<TcpStream>> = futures::stream::iter(0..count)
        .map(|_| async move {
            let mut s = connect_from(from, server).await?;
            // A refused connection may be closed before (or while) this is written.
            let _ = s.write_all(HALF_HEADER).await;
            Ok(s)
        })
        .buffer_unordered(200)
        .collect()
        .await;
    let errors: Vec<String> = opened
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    let streams: Vec<TcpStream> = opened.into_iter().filter_map(Result::ok).collect();
    say(&format!(
        "opened {} failed {} {:?}",
        streams.len(),
        errors.len(),
        errors.first()
    ));
    let started = Instant::now();
    let waits: Vec<_> = streams
        .into_iter()
        .map(|s| tokio::spawn(until_closed(s, Duration::from_secs(120))))
        .collect();
    let mut open = 0;
    for w in waits {
        if w.await.expect("join").is_none() {
            open += 1;
        }
    }
    say(&format!(
        "closed open {open} after {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    // Held until the test is done with this process.
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut rest);
}

/// The issue's attack: two processes open 10,000 sockets each and send half a request header
/// on each. The server holds what its caps allow and refuses the rest at once, `/healthz` and
/// a tenant are served throughout, and the held sockets are closed after the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_slow_sockets() {
    let app = TestApp::with(Backend::Sqlite)
        .with_config(|config| {
            config.http.header_timeout = Duration::from_secs(5);
            // The production default, which `TestApp` lifts for its other tests.
            config.http.max_connections_per_ip =
                gpurent_server::HttpLimits::default().max_connections_per_ip;
        })
        .start()
        .await;
    let server = app.server.as_ref().expect("running").addr;
    let (alice, _) = tenant(&app, "alice").await;
    let holders: Vec<Holder> = (0..HOLDERS)
        .map(|i| Holder::start(server, client_ip(10 + i), PER_HOLDER))
        .collect();

    // Served while the sockets are opened and held.
    let mut slowest = Duration::ZERO;
    let mut probes = 0;
    let opening = async move {
        let mut holders = holders;
        let mut reports = Vec::new();
        for h in &mut holders {
            reports.push(h.report().await);
        }
        (holders, reports)
    };
    tokio::pin!(opening);
    let (mut holders, reports) = loop {
        let started = Instant::now();
        served_within(&app, &alice).await;
        slowest = slowest.max(started.elapsed());
        probes += 1;
        tokio::select! {
            done = &mut opening => break done,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    };
    let started = Instant::now();
    served_within(&app, &alice).await;
    eprintln!(
        "holders: {reports:?}; {probes} probes while opening, slowest {slowest:?}; \
         after: {:?}",
        started.elapsed()
    );
    for report in &reports {
        assert!(
            report.starts_with(&format!("opened {PER_HOLDER} failed 0")),
            "{report}"
        );
    }
    // Every socket is closed by the server: the refused at once, the held at their timeout.
    for h in &mut holders {
        let report = h.report().await;
        eprintln!("holder: {report}");
        assert!(report.starts_with("closed open 0 "), "{report}");
    }
    api_serves(&app, &alice).await;
    // Each socket was either refused when accepted or held and closed at its header timeout.
    let refused = metric(
        &app,
        "gpurent_http_connections_refused_total{cap=\"per_ip\"}",
    )
    .await;
    let timed_out = metric(
        &app,
        "gpurent_http_slow_clients_closed_total{reason=\"header\"}",
    )
    .await;
    eprintln!("refused at once: {refused}; held until the header timeout: {timed_out}");
    assert_eq!(refused + timed_out, u64::from(HOLDERS) * PER_HOLDER as u64);
    assert!(refused > 0);
    drop(holders);
    app.shutdown().await;
}
