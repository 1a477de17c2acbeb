//! Published HTTP ports (`/proxy/ID/PORT/`): requests, downloads, uploads and WebSockets
//! reach a real HTTP server standing in for the app inside the instance, through the real
//! agent's tunnel (an executor of this test enters the "instance" by connecting to that
//! server); only the owner gets in, by bearer token or by the cookie of a one-time link.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use gpurent_agent::entry::{
    Entered, EntryControl, EntryError, EntryKind, EntryRequest, ExitStatus,
};
use gpurent_agent::executor::SimExecutor;
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::reconcile::Observed;
use gpurent_agent::{AgentError, Executor};
use gpurent_server::ServerConfig;
use gpurent_store::Backend;
use gpurent_types::agent::Assignment;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::app::{Client, TestApp};
use crate::both_stores;

/// The published port the test's app is at, and one where nothing listens.
const APP_PORT: u16 = 8888;
const DEAD_PORT: u16 = 9999;
const DOWNLOAD: usize = 10 * 1024 * 1024;

// ---------------------------------------------------------------------------------------
// The "instance": an executor whose TCP entries connect to servers of this test.

/// The sim executor, but a TCP entry connects to the test's server mapped to that port.
#[derive(Debug)]
struct PortExecutor {
    sim: SimExecutor,
    ports: Mutex<HashMap<u16, SocketAddr>>,
}

struct NoProcess;

#[async_trait]
impl EntryControl for NoProcess {
    async fn resize(&self, _: u16, _: u16) -> Result<(), EntryError> {
        Ok(())
    }
    async fn signal(&self, _: &str) -> Result<(), EntryError> {
        Ok(())
    }
    async fn wait(&mut self) -> Result<ExitStatus, EntryError> {
        Ok(ExitStatus::Code(0))
    }
}

#[async_trait]
impl Executor for PortExecutor {
    fn name(&self) -> &'static str {
        self.sim.name()
    }
    async fn start(
        &self,
        a: &Assignment,
        volume: Option<&std::path::Path>,
    ) -> Result<(), AgentError> {
        self.sim.start(a, volume).await
    }
    async fn stop(&self, id: &str, grace: Option<Duration>) -> Result<(), AgentError> {
        self.sim.stop(id, grace).await
    }
    async fn list(&self) -> Result<Vec<Observed>, AgentError> {
        self.sim.list().await
    }
    async fn enter(&self, id: &str, request: EntryRequest) -> Result<Entered, EntryError> {
        let EntryKind::Tcp { port } = request.kind else {
            return Err(EntryError::Unsupported {
                what: "a session",
                reservation_id: id.to_owned(),
                why: "this test's instances have ports only".into(),
            });
        };
        let addr = self.ports.lock().unwrap().get(&port).copied();
        let addr = addr.ok_or(EntryError::NothingListens { port })?;
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|_| EntryError::NothingListens { port })?;
        let (read, write) = stream.into_split();
        Ok(Entered {
            stdin: Box::new(write),
            stdout: Box::new(read),
            stderr: None,
            control: Box::new(NoProcess),
        })
    }
}

// ---------------------------------------------------------------------------------------
// The app: echoes requests, serves a download, digests uploads, echoes WebSocket messages.

type AppBody = BoxBody<Bytes, Infallible>;

fn download_byte(i: usize) -> u8 {
    u8::try_from((i * 31 + 7) % 251).unwrap()
}

fn full(b: impl Into<Bytes>) -> AppBody {
    Full::new(b.into()).boxed()
}

fn accept_key(key: &str) -> String {
    let mut sha = sha1::Sha1::new();
    sha1::Digest::update(&mut sha, key.as_bytes());
    sha1::Digest::update(&mut sha, b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(sha1::Digest::finalize(sha))
}

async fn app(
    mut request: hyper::Request<Incoming>,
) -> Result<hyper::Response<AppBody>, Infallible> {
    let path = request.uri().path().to_owned();
    if path.ends_with("/download") {
        let chunks = (0..DOWNLOAD / 65536).map(|c| {
            let chunk: Vec<u8> = (c * 65536..(c + 1) * 65536).map(download_byte).collect();
            Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)))
        });
        let body = StreamBody::new(futures::stream::iter(chunks)).boxed();
        return Ok(hyper::Response::new(body));
    }
    if path.ends_with("/upload") {
        let Ok(body) = request.into_body().collect().await else {
            return Ok(hyper::Response::new(full("the body was cut")));
        };
        let body = body.to_bytes();
        let answer = json!({"len": body.len(), "sha256": hex::encode(Sha256::digest(&body))});
        return Ok(hyper::Response::new(full(answer.to_string())));
    }
    if request.headers().contains_key("upgrade") {
        let key = request
            .headers()
            .get("sec-websocket-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                ws_echo(TokioIo::new(upgraded)).await;
            }
        });
        let response = hyper::Response::builder()
            .status(101)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-accept", accept_key(&key))
            .body(full(""))
            .unwrap();
        return Ok(response);
    }
    let headers: serde_json::Map<String, Value> = request
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or(""))))
        .collect();
    let answer = json!({
        "method": request.method().as_str(),
        "uri": request.uri().to_string(),
        "headers": headers,
    });
    Ok(hyper::Response::new(full(answer.to_string())))
}

/// A server for `app` on loopback; aborted when dropped.
struct AppServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AppServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start_app() -> AppServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(app))
                    .with_upgrades()
                    .await;
            });
        }
    });
    AppServer { addr, task }
}

// ---------------------------------------------------------------------------------------
// WebSocket frames (RFC 6455), as little as an echo needs.

async fn write_frame<W: AsyncWriteExt + Unpin>(w: &mut W, opcode: u8, payload: &[u8], mask: bool) {
    let mut out = vec![0x80 | opcode];
    let m = if mask { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | u8::try_from(n).unwrap()),
        n if n <= 0xffff => {
            out.push(m | 126);
            out.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if mask {
        let key: [u8; 4] = rand::random();
        out.extend_from_slice(&key);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    w.write_all(&out).await.unwrap();
}

async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    r.read_exact(&mut head).await.ok()?;
    let opcode = head[0] & 0x0f;
    let masked = head[1] & 0x80 != 0;
    let len = match head[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).await.ok()?;
            u64::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            r.read_exact(&mut b).await.ok()?;
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    let mut key = [0u8; 4];
    if masked {
        r.read_exact(&mut key).await.ok()?;
    }
    let mut payload = vec![0u8; usize::try_from(len).ok()?];
    r.read_exact(&mut payload).await.ok()?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= key[i % 4];
        }
    }
    Some((opcode, payload))
}

async fn ws_echo<S: AsyncReadExt + AsyncWriteExt + Unpin>(mut s: S) {
    while let Some((opcode, payload)) = read_frame(&mut s).await {
        write_frame(&mut s, opcode, &payload, false).await;
        if opcode == 8 {
            return;
        }
    }
}

/// Opens a WebSocket to `path` through the control plane with these extra header lines
/// (and `Host: host`); the status line when the answer is not a 101.
async fn ws_open(
    server: SocketAddr,
    host: &str,
    path: &str,
    headers: &str,
) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(server).await.unwrap();
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{headers}\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        if s.read(&mut b).await.unwrap() == 0 {
            break;
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    if !head.starts_with("HTTP/1.1 101") {
        return Err(head.lines().next().unwrap_or("").to_owned());
    }
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("sec-websocket-accept: {}", accept_key(key)).to_ascii_lowercase()),
        "{head}"
    );
    Ok(s)
}

/// Opens a WebSocket with this credential header and checks that messages come back as
/// sent; the status line when the answer is not a 101.
async fn ws_roundtrip(server: SocketAddr, path: &str, credential: &str) -> Result<(), String> {
    let mut s = ws_open(server, &server.to_string(), path, credential).await?;
    let big: Vec<u8> = (0..300_000).map(download_byte).collect();
    for (opcode, message) in [(1u8, b"hello".to_vec()), (2, big), (1, b"again".to_vec())] {
        write_frame(&mut s, opcode, &message, true).await;
        let (got_op, got) = read_frame(&mut s).await.expect("an echo");
        assert_eq!((got_op, got.len()), (opcode, message.len()));
        assert!(got == message, "the echo differs");
    }
    write_frame(&mut s, 8, &[0x03, 0xe8], true).await;
    let (op, _) = read_frame(&mut s).await.expect("the close echoed");
    assert_eq!(op, 8);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The control plane, a node whose instance has the app at port 8888, a running reservation.

struct Setup {
    app: TestApp,
    /// Where the instance's ports lead.
    executor: Arc<PortExecutor>,
    _app_server: AppServer,
    /// The owner's and another tenant's tokens.
    owner: String,
    stranger: String,
    rid: String,
    /// Follows no redirects, so the proxy's own answers are seen.
    http: reqwest::Client,
}

async fn user(app: &TestApp, name: &str) -> String {
    let (status, body) = app
        .admin()
        .post(
            "/api/v1/users",
            &json!({"name": name, "role": "tenant", "credit": "100"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["token"].as_str().unwrap().to_owned()
}

async fn setup(backend: Backend, configure: Option<fn(&mut ServerConfig)>) -> Setup {
    setup_with(TestApp::with(backend), configure).await
}

async fn setup_with(
    mut builder: crate::app::TestAppBuilder,
    configure: Option<fn(&mut ServerConfig)>,
) -> Setup {
    if let Some(configure) = configure {
        builder = builder.with_config(configure);
    }
    let mut app = builder.start().await;
    let app_server = start_app().await;
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let executor = Arc::new(PortExecutor {
        sim: SimExecutor::new(),
        ports: Mutex::new(HashMap::from([
            (APP_PORT, app_server.addr),
            (DEAD_PORT, dead_addr),
        ])),
    });
    let gpus = Arc::new(SimGpus::parse("2xRTX4090", "node-0").unwrap());
    app.add_node_running("node-0", gpus, executor.clone()).await;
    let owner = user(&app, "olga").await;
    let stranger = user(&app, "sam").await;
    let client = app.client(Some(&owner));
    let (status, r) = client
        .post(
            "/api/v1/reservations",
            &json!({"gpu_type": "rtx4090", "hours": 1, "http_ports": [APP_PORT, DEAD_PORT]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["http_ports"], json!([APP_PORT, DEAD_PORT]));
    let rid = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&client, &rid, "running").await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let setup = Setup {
        app,
        executor,
        _app_server: app_server,
        owner,
        stranger,
        rid,
        http,
    };
    // The agent's tunnel comes up a moment after the node joined.
    let url = setup.url(&format!("/proxy/{}/{APP_PORT}/echo", setup.rid));
    setup
        .app
        .eventually("the proxy to reach the app", || async {
            let r = setup.http.get(&url).bearer_auth(&setup.owner).send().await;
            r.is_ok_and(|r| r.status() == StatusCode::OK)
        })
        .await;
    setup
}

impl Setup {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.app.base)
    }

    fn owner_client(&self) -> Client {
        self.app.client(Some(&self.owner))
    }

    fn server_addr(&self) -> SocketAddr {
        self.app.server.as_ref().unwrap().addr
    }

    /// A one-time link of the owner's to a port.
    async fn link(&self, port: u16) -> Value {
        let (status, link) = self
            .owner_client()
            .post(
                &format!("/api/v1/reservations/{}/proxy-links", self.rid),
                &json!({ "port": port }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{link}");
        link
    }

    /// Opens a link: its answer's status, `Location` and `Set-Cookie`.
    async fn visit(&self, url: &str) -> (StatusCode, Option<String>, Option<String>) {
        let r = self.http.get(url).send().await.unwrap();
        let header = |name| {
            r.headers()
                .get(name)
                .map(|v: &reqwest::header::HeaderValue| v.to_str().unwrap().to_owned())
        };
        (r.status(), header("location"), header("set-cookie"))
    }
}

/// `name=value` of a Set-Cookie header.
fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().trim().to_owned()
}

// ---------------------------------------------------------------------------------------
// The stories.

/// The owner's bearer token gets through: the path as sent (prefix included, query kept),
/// the credential kept from the app, X-Forwarded-*, a 10 MiB download and a 3 MiB upload
/// intact, and `get` says where the port is.
async fn the_owner_reaches_the_app_with_a_bearer_token(backend: Backend) {
    let s = setup(backend, None).await;
    let rid = &s.rid;
    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}/lab/tree?a=1&b=%2F")))
        .bearer_auth(&s.owner)
        .header("cookie", "_xsrf=abc")
        .header("x-forwarded-for", "10.0.0.9")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["method"], "GET");
    assert_eq!(
        echo["uri"],
        format!("/proxy/{rid}/{APP_PORT}/lab/tree?a=1&b=%2F")
    );
    let h = &echo["headers"];
    assert_eq!(
        h["authorization"],
        Value::Null,
        "the bearer token reached the app: {h}"
    );
    assert_eq!(h["cookie"], "_xsrf=abc");
    assert_eq!(h["x-forwarded-for"], "10.0.0.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    let host = s.server_addr().to_string();
    assert_eq!(h["host"], host.as_str(), "Host stays the client's");
    assert_eq!(h["x-forwarded-host"], host.as_str());

    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}/download")))
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body = r.bytes().await.unwrap();
    let expected: Vec<u8> = (0..DOWNLOAD).map(download_byte).collect();
    assert_eq!(body.len(), DOWNLOAD);
    assert_eq!(
        hex::encode(Sha256::digest(&body)),
        hex::encode(Sha256::digest(&expected))
    );

    let upload: Vec<u8> = (0..3 * 1024 * 1024).map(|i| download_byte(i * 7)).collect();
    let r = s
        .http
        .post(s.url(&format!("/proxy/{rid}/{APP_PORT}/upload")))
        .bearer_auth(&s.owner)
        .body(upload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let digest: Value = r.json().await.unwrap();
    assert_eq!(digest["len"], upload.len());
    assert_eq!(digest["sha256"], hex::encode(Sha256::digest(&upload)));

    // Without the slash after the port: sent on to it (the cookie's path has it).
    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}?x=1")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(
        r.headers()["location"],
        format!("/proxy/{rid}/{APP_PORT}/?x=1").as_str()
    );

    let (_, got) = s
        .owner_client()
        .get(&format!("/api/v1/reservations/{rid}"))
        .await;
    assert_eq!(got["http_ports"], json!([APP_PORT, DEAD_PORT]));
    assert_eq!(
        got["http"][0],
        json!({"port": APP_PORT, "url": format!("http://{host}/proxy/{rid}/{APP_PORT}/")})
    );
    // Use through the proxy counts as activity (idle reclaim leaves it running).
    let active = format!(
        "SELECT COUNT(*) FROM reservations WHERE id = '{rid}' AND last_active_at IS NOT NULL"
    );
    s.app
        .eventually("the proxied use to count as activity", || async {
            s.app.raw_count(&active).await == 1
        })
        .await;
    let metrics = s.app.anonymous().get_text("/metrics", "x").await.1;
    let requests = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gpurent_proxy_requests_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("gpurent_proxy_requests_total");
    assert!(requests >= 4, "{requests} proxied requests counted");
    s.app.shutdown().await;
}
both_stores!(bearer, the_owner_reaches_the_app_with_a_bearer_token);

/// Anyone but the owner gets the same 404 as a path that does not exist: another tenant,
/// an admin, no credential, a wrong token, a port not published, an unknown reservation, a
/// stopped one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anyone_else_gets_not_found() {
    let s = setup(Backend::Sqlite, None).await;
    let rid = &s.rid;
    let path = format!("/proxy/{rid}/{APP_PORT}/echo");
    let cases: Vec<(&str, reqwest::RequestBuilder)> = vec![
        (
            "another tenant",
            s.http.get(s.url(&path)).bearer_auth(&s.stranger),
        ),
        (
            "an admin",
            s.http.get(s.url(&path)).bearer_auth("gpr_test_admin"),
        ),
        ("no credential", s.http.get(s.url(&path))),
        (
            "a wrong token",
            s.http.get(s.url(&path)).bearer_auth("gpr_nonsense"),
        ),
        (
            "a made-up cookie",
            s.http
                .get(s.url(&path))
                .header("cookie", "gpurent_proxy=gps_00"),
        ),
        (
            "a port not published",
            s.http
                .get(s.url(&format!("/proxy/{rid}/7777/echo")))
                .bearer_auth(&s.owner),
        ),
        (
            "an unknown reservation",
            s.http
                .get(s.url(&format!(
                    "/proxy/00000000-0000-0000-0000-000000000000/{APP_PORT}/"
                )))
                .bearer_auth(&s.owner),
        ),
        (
            "another tenant's POST",
            s.http.post(s.url(&path)).bearer_auth(&s.stranger).body("x"),
        ),
    ];
    for (who, request) in cases {
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{who}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{who}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("no route for /proxy/"),
            "{who}: {message}"
        );
    }
    // Links: only the owner makes them, only for published ports.
    let links = format!("/api/v1/reservations/{rid}/proxy-links");
    let (status, body) = s
        .app
        .client(Some(&s.stranger))
        .post(&links, &json!({"port": APP_PORT}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = s.owner_client().post(&links, &json!({"port": 7777})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not publish port 7777"),
        "{body}"
    );
    // Stopped: gone for the owner too.
    let (status, _) = s
        .owner_client()
        .post(&format!("/api/v1/reservations/{rid}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let r = s
        .http
        .get(s.url(&path))
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    s.app.shutdown().await;
}

/// Bad published ports are refused with a message that says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_http_ports_are_refused() {
    let app = TestApp::with(Backend::Sqlite)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let token = user(&app, "vera").await;
    let client = app.client(Some(&token));
    for (ports, says) in [
        (json!([8888, 8888]), "8888 is given twice"),
        (json!([0]), "0 is not a port"),
        (json!([1, 2, 3, 4, 5, 6, 7, 8, 9]), "at most 8 ports"),
    ] {
        let (status, body) = client
            .post(
                "/api/v1/reservations",
                &json!({"gpu_type": "rtx4090", "hours": 1, "http_ports": ports}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    let (status, body) = client
        .post(
            "/api/v1/reservations",
            &json!({"gpu_type": "rtx4090", "hours": 1, "http_ports": [70000]}),
        )
        .await;
    assert!(status.is_client_error(), "{status} {body}");
    app.shutdown().await;
}

/// A one-time link sets a cookie for its port (HttpOnly, SameSite=Lax, the port's path) and
/// sends the browser on without the link; it works once; the cookie opens that port of that
/// reservation only, and the app never sees it.
async fn a_link_opens_its_port_once(backend: Backend) {
    let s = setup(backend, None).await;
    let rid = &s.rid;
    let link = s.link(APP_PORT).await;
    let url = link["url"].as_str().unwrap();
    let base = format!("/proxy/{rid}/{APP_PORT}/");
    assert!(
        url.starts_with(&format!(
            "http://{}{base}?gpurent_link=gpl_",
            s.server_addr()
        )),
        "{url}"
    );
    let (status, location, cookie) = s.visit(&format!("{url}&then=1")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(location.as_deref(), Some(format!("{base}?then=1").as_str()));
    let cookie = cookie.expect("a cookie");
    for attribute in [
        format!("Path={base}"),
        "HttpOnly".into(),
        "SameSite=Lax".into(),
    ] {
        assert!(cookie.contains(&attribute), "{cookie} lacks {attribute}");
    }
    assert!(!cookie.contains("Secure"), "no TLS here: {cookie}");
    assert!(cookie.contains("Max-Age=43200"), "{cookie}");
    let pair = cookie_pair(&cookie);
    assert!(pair.starts_with("gpurent_proxy=gps_"), "{pair}");
    // Once only.
    let (status, _, again) = s.visit(url).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(again.is_none());
    // The cookie gets in, and stays between the browser and the proxy.
    let r = s
        .http
        .get(s.url(&format!("{base}echo")))
        .header("cookie", format!("theme=dark; {pair}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["cookie"], "theme=dark", "{echo}");
    // ... for that port of that reservation only.
    for other in [
        format!("/proxy/{rid}/{DEAD_PORT}/"),
        format!("/proxy/00000000-0000-0000-0000-000000000000/{APP_PORT}/"),
    ] {
        let r = s
            .http
            .get(s.url(&other))
            .header("cookie", &pair)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{other}");
    }
    // Never an API token.
    let token = pair.trim_start_matches("gpurent_proxy=");
    let r = s
        .http
        .get(s.url("/api/v1/reservations"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // A link for one port does not open another.
    let link = s.link(APP_PORT).await;
    let url = link["url"]
        .as_str()
        .unwrap()
        .replace(&format!("/{APP_PORT}/"), &format!("/{DEAD_PORT}/"));
    let (status, _, cookie) = s.visit(&url).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(cookie.is_none());
    s.app.shutdown().await;
}
both_stores!(link, a_link_opens_its_port_once);

/// A WebSocket through the proxy: text and a 300 KB binary message echoed, and the close,
/// with the bearer token and with the link's cookie; a stranger's gets no upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_are_spliced_through() {
    let s = setup(Backend::Sqlite, None).await;
    let rid = &s.rid;
    let path = format!("/proxy/{rid}/{APP_PORT}/api/kernels/k1/channels?session_id=1");
    let addr = s.server_addr();
    ws_roundtrip(addr, &path, &format!("Authorization: Bearer {}", s.owner))
        .await
        .unwrap();
    let link = s.link(APP_PORT).await;
    let (_, _, cookie) = s.visit(link["url"].as_str().unwrap()).await;
    let pair = cookie_pair(&cookie.unwrap());
    ws_roundtrip(addr, &path, &format!("Cookie: {pair}"))
        .await
        .unwrap();
    let refused = ws_roundtrip(
        addr,
        &path,
        &format!("Authorization: Bearer {}", s.stranger),
    )
    .await
    .unwrap_err();
    assert!(refused.contains("404"), "{refused}");
    let metrics = s.app.anonymous().get_text("/metrics", "x").await.1;
    assert!(
        metrics.contains("gpurent_proxy_websocket_upgrades_total 2"),
        "{metrics}"
    );
    s.app.shutdown().await;
}

/// 502 with a message that says why: nothing listens on the port; the agent is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_port_is_a_bad_gateway() {
    let s = setup_with(TestApp::with(Backend::Sqlite).with_cuttable_links(), None).await;
    let rid = s.rid.clone();
    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{DEAD_PORT}/")))
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "bad_gateway");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "cannot reach port {DEAD_PORT} of reservation {rid}"
        )) && message.contains("nothing listens"),
        "{message}"
    );
    // The agent's link to the control plane cut: its tunnel is gone.
    s.app.cut("node-0");
    let url = s.url(&format!("/proxy/{rid}/{APP_PORT}/"));
    let mut last = String::new();
    for _ in 0..200 {
        let r = s.http.get(&url).bearer_auth(&s.owner).send().await.unwrap();
        let status = r.status();
        last = r.text().await.unwrap();
        if status == StatusCode::BAD_GATEWAY && last.contains("agent is not connected") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(last.contains("agent is not connected"), "{last}");
    s.app.shutdown().await;
}

/// `--proxy-domain`: `ID-PORT.DOMAIN` reaches the app with the path at its root (API paths
/// too are the app's there), and a link there sets its cookie for the whole host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_domain_puts_the_app_at_the_root() {
    let s = setup(
        Backend::Sqlite,
        Some(|c: &mut ServerConfig| c.proxy_domain = Some("apps.test".into())),
    )
    .await;
    let rid = &s.rid;
    let listener_port = s.server_addr().port();
    let host = format!("{rid}-{APP_PORT}.apps.test:{listener_port}");
    let r = s
        .http
        .get(s.url("/api/v1/reservations?x=1"))
        .header("host", &host)
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["uri"], "/api/v1/reservations?x=1", "{echo}");
    assert_eq!(echo["headers"]["host"], host.as_str());
    // A stranger there: not found, as anywhere.
    let r = s
        .http
        .get(s.url("/"))
        .header("host", &host)
        .bearer_auth(&s.stranger)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let link = s.link(APP_PORT).await;
    let domain_url = link["domain_url"].as_str().unwrap();
    assert_eq!(
        domain_url.split("?gpurent_link=").next().unwrap(),
        format!("http://{host}/")
    );
    let query = domain_url.split_once('?').unwrap().1;
    let r = s
        .http
        .get(s.url(&format!("/lab?{query}")))
        .header("host", &host)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/lab");
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("Path=/;"), "{cookie}");
    let r = s
        .http
        .get(s.url("/lab"))
        .header("host", &host)
        .header("cookie", cookie_pair(&cookie))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["uri"], "/lab");
    // Other hosts still get the API.
    let (status, _) = s.owner_client().get("/api/v1/reservations").await;
    assert_eq!(status, StatusCode::OK);
    s.app.shutdown().await;
}

/// A process group killed when dropped (JupyterLab and its kernels).
struct Group(tokio::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// JupyterLab behind the proxy as a browser uses it, on a public-looking host: the page by
/// the link's cookie, a kernel started with Jupyter's XSRF cookie and header, and code run
/// over the kernel's WebSocket (Origin = the control plane's host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs JupyterLab: GPURENT_TEST_JUPYTER=path/to/jupyter (pip install jupyterlab)"]
async fn jupyterlab_works_behind_the_proxy() {
    let jupyter = std::env::var("GPURENT_TEST_JUPYTER").expect("GPURENT_TEST_JUPYTER");
    let s = setup(Backend::Sqlite, None).await;
    let rid = &s.rid;
    let base = format!("/proxy/{rid}/{APP_PORT}/");
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let root = tempfile::tempdir().unwrap();
    let child = tokio::process::Command::new(&jupyter)
        .args(["lab", "--no-browser", "--allow-root", "--ip=127.0.0.1"])
        .arg(format!("--port={port}"))
        .arg(format!("--ServerApp.base_url={base}"))
        .arg("--IdentityProvider.token=")
        .arg("--ServerApp.password=")
        // Listening on loopback only, Jupyter refuses Host names that are not local.
        .arg("--ServerApp.allow_remote_access=True")
        .arg(format!("--ServerApp.root_dir={}", root.path().display()))
        .env("JUPYTER_RUNTIME_DIR", root.path().join("runtime"))
        .env("JUPYTER_CONFIG_DIR", root.path().join("config"))
        .env("JUPYTER_DATA_DIR", root.path().join("data"))
        .env("HOME", root.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(root.path().join("jupyter.log")).unwrap())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("jupyter");
    let _jupyter = Group(child);
    s.executor
        .ports
        .lock()
        .unwrap()
        .insert(APP_PORT, SocketAddr::from(([127, 0, 0, 1], port)));
    // The control plane as the world names it; the test's connections go to loopback.
    let host = "gpu.example.test";
    let link = s.link(APP_PORT).await;
    let link = link["url"].as_str().unwrap().to_owned();
    let link_path = &link[link.find("/proxy/").unwrap()..];
    let (status, _, cookie) = s.visit(&s.url(link_path)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let session = cookie_pair(&cookie.unwrap());
    let mut lab = None;
    let mut last = String::new();
    for _ in 0..600 {
        let r = s
            .http
            .get(s.url(&format!("{base}lab")))
            .header("host", host)
            .header("cookie", &session)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            lab = Some(r);
            break;
        }
        last = format!("{} {}", r.status(), r.text().await.unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(root.path().join("jupyter.log")).unwrap_or_default();
    let lab = lab.unwrap_or_else(|| panic!("JupyterLab's page: {last}\n{log}"));
    let xsrf = lab
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("_xsrf="))
        .expect("Jupyter's XSRF cookie");
    assert!(xsrf.contains(&format!("Path={base}")), "{xsrf}");
    let xsrf = cookie_pair(&xsrf);
    let page = lab.text().await.unwrap();
    assert!(
        page.contains(&format!("\"baseUrl\": \"{base}\"")),
        "the page's base URL"
    );
    let cookies = format!("{session}; {xsrf}");
    let token = xsrf.trim_start_matches("_xsrf=");
    let r = s
        .http
        .post(s.url(&format!("{base}api/kernels")))
        .header("host", host)
        .header("cookie", &cookies)
        .header("x-xsrftoken", token)
        .header("content-type", "application/json")
        .body(r#"{"name": "python3"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let kernel: Value = r.json().await.unwrap();
    let kernel = kernel["id"].as_str().unwrap().to_owned();
    let mut ws = ws_open(
        s.server_addr(),
        host,
        &format!("{base}api/kernels/{kernel}/channels?session_id=s1"),
        &format!("Cookie: {cookies}\r\nOrigin: http://{host}"),
    )
    .await
    .expect("the kernel's WebSocket");
    let execute = json!({
        "header": {"msg_id": "m1", "username": "t", "session": "s1",
            "msg_type": "execute_request", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": "print(6 * 7)", "silent": false, "store_history": false,
            "user_expressions": {}, "allow_stdin": false, "stop_on_error": true},
    });
    write_frame(&mut ws, 1, execute.to_string().as_bytes(), true).await;
    let printed = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some((opcode, payload)) = read_frame(&mut ws).await {
            if opcode != 1 {
                continue;
            }
            let message: Value = serde_json::from_slice(&payload).unwrap();
            if message["msg_type"] == "stream" && message["content"]["name"] == "stdout" {
                return Some(message["content"]["text"].as_str().unwrap().to_owned());
            }
        }
        None
    })
    .await
    .expect("the kernel's output in time");
    assert_eq!(printed.as_deref(), Some("42\n"));
    s.app.shutdown().await;
}

/// An upload to an app may take longer than the listener's body deadline (which answers 408
/// to slow API requests): the proxy's requests stream as long as the app reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_is_not_cut_by_the_body_deadline() {
    let s = setup(
        Backend::Sqlite,
        Some(|c: &mut ServerConfig| c.http.body_timeout = Duration::from_millis(300)),
    )
    .await;
    let mut conn = TcpStream::connect(s.server_addr()).await.unwrap();
    let body = b"0123456789";
    let head = format!(
        "POST /proxy/{}/{APP_PORT}/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        s.rid,
        s.owner,
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    // Ten bytes over three deadlines and more.
    for b in body {
        conn.write_all(&[*b]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains(&hex::encode(Sha256::digest(body))),
        "the app got the whole body: {answer}"
    );
    s.app.shutdown().await;
}

/// The real thing on the process executor: `python3 -m http.server` inside the instance,
/// reached through the proxy by the agent entering the instance's network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_in_a_process_instance() {
    let mut app = TestApp::with(Backend::Sqlite).start().await;
    let dir = app.add_process_node("node-0", Duration::from_secs(1)).await;
    let token = user(&app, "pia").await;
    let client = app.client(Some(&token));
    // Processes share the node's network here: a port nobody else uses.
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let (status, r) = client
        .post(
            "/api/v1/reservations",
            &json!({"gpu_type": "rtx4090", "hours": 1, "http_ports": [port],
                "command": ["sh", "-c", format!(
                    "d=www/proxy/$GPURENT_RESERVATION_ID/{port} && mkdir -p $d && \
                     echo served-from-the-instance > $d/hello.txt && \
                     exec python3 -m http.server {port} --bind 127.0.0.1 --directory www")]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let rid = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&client, &rid, "running").await;
    let url = format!("{}/proxy/{rid}/{port}/hello.txt", app.base);
    let http = reqwest::Client::new();
    let mut last = String::new();
    for _ in 0..400 {
        let r = http.get(&url).bearer_auth(&token).send().await.unwrap();
        let status = r.status();
        last = r.text().await.unwrap();
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // http.server serves the path as it gets it, the prefix included.
    assert_eq!(last, "served-from-the-instance\n");
    let _ = client
        .post(&format!("/api/v1/reservations/{rid}/stop"), &json!({}))
        .await;
    app.shutdown().await;
    gpurent_agent::testing::kill_processes_naming(&dir);
}

/// The owner's console session opens its ports (the links on its instance page); the app
/// sees none of the console's cookies; another tenant's session gets the 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owners_console_session_gets_in() {
    let s = setup(Backend::Sqlite, None).await;
    let base = format!("/proxy/{}/{APP_PORT}/", s.rid);
    let as_user = |token: &str| crate::app::Tenant {
        id: String::new(),
        client: s.app.client(Some(token)),
    };
    let owner = as_user(&s.owner);
    let console = crate::console_support::login(&s.app, &owner, "olga").await;
    let r = s
        .http
        .get(s.url(&format!("{base}echo")))
        .header(
            "cookie",
            format!(
                "theme=dark; gpurent_session={}; gpurent_lang=zh-CN",
                console.cookie
            ),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["cookie"], "theme=dark", "{echo}");
    let stranger = as_user(&s.stranger);
    let theirs = crate::console_support::login(&s.app, &stranger, "sam").await;
    let r = s
        .http
        .get(s.url(&format!("{base}echo")))
        .header("cookie", format!("gpurent_session={}", theirs.cookie))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    s.app.shutdown().await;
}
