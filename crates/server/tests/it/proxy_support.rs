//! What the proxy's tests share: an executor whose TCP entries reach servers of the test (the
//! "instance"), the app standing in for what runs in it, WebSocket frames, and a control plane
//! with a running reservation whose instance has the app at port 8888.

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

/// The published port the test's app is at, and one where nothing listens.
pub(crate) const APP_PORT: u16 = 8888;
pub(crate) const DEAD_PORT: u16 = 9999;
pub(crate) const DOWNLOAD: usize = 10 * 1024 * 1024;

// ---------------------------------------------------------------------------------------
// The "instance": an executor whose TCP entries connect to servers of this test.

/// The sim executor, but a TCP entry connects to the test's server mapped to that port.
#[derive(Debug)]
pub(crate) struct PortExecutor {
    pub(crate) sim: SimExecutor,
    pub(crate) ports: Mutex<HashMap<u16, SocketAddr>>,
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

pub(crate) fn download_byte(i: usize) -> u8 {
    u8::try_from((i * 31 + 7) % 251).unwrap()
}

fn full(b: impl Into<Bytes>) -> AppBody {
    Full::new(b.into()).boxed()
}

pub(crate) fn accept_key(key: &str) -> String {
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
    if path.ends_with("/set-cookies") {
        // A hostile app: every cookie name of the control plane's, prefixed or not, one for
        // a whole domain, and one of its own.
        let mut response = hyper::Response::builder().header("content-type", "text/html");
        for cookie in HOSTILE_COOKIES.iter().chain([&OWN_COOKIE]) {
            response = response.header("set-cookie", *cookie);
        }
        return Ok(response
            .body(full("<script>document.title='app'</script>"))
            .unwrap());
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

/// What the hostile app's `/set-cookies` sets that no browser may be given.
pub(crate) const HOSTILE_COOKIES: [&str; 9] = [
    "gpurent_session=gpr_attacker; Path=/",
    "__Host-gpurent_session=gpr_attacker; Path=/; Secure",
    "gpurent_login=x; Path=/",
    "__Host-gpurent_login=x; Path=/; Secure",
    "gpurent_lang=zh-CN; Path=/",
    "__Host-gpurent_lang=zh-CN; Path=/; Secure",
    "gpurent_proxy=gps_attacker; Path=/",
    "__Host-gpurent_proxy=gps_attacker; Path=/; Secure",
    "everywhere=1; Path=/; Domain=localhost",
];
/// The app's own cookie, which it may set on its own host.
pub(crate) const OWN_COOKIE: &str = "theme=dark; Path=/; HttpOnly";

/// A server for `app` on loopback; aborted when dropped.
pub(crate) struct AppServer {
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

pub(crate) async fn write_frame<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    opcode: u8,
    payload: &[u8],
    mask: bool,
) {
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

pub(crate) async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> Option<(u8, Vec<u8>)> {
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

pub(crate) async fn ws_echo<S: AsyncReadExt + AsyncWriteExt + Unpin>(mut s: S) {
    while let Some((opcode, payload)) = read_frame(&mut s).await {
        write_frame(&mut s, opcode, &payload, false).await;
        if opcode == 8 {
            return;
        }
    }
}

/// Opens a WebSocket to `path` through the control plane with these extra header lines
/// (and `Host: host`); the status line when the answer is not a 101.
pub(crate) async fn ws_open(
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
pub(crate) async fn ws_roundtrip(
    server: SocketAddr,
    path: &str,
    credential: &str,
) -> Result<(), String> {
    ws_roundtrip_on(server, &server.to_string(), path, credential).await
}

/// `ws_roundtrip` with `Host: host` (an app's host on the apps' site).
pub(crate) async fn ws_roundtrip_on(
    server: SocketAddr,
    host: &str,
    path: &str,
    credential: &str,
) -> Result<(), String> {
    let mut s = ws_open(server, host, path, credential).await?;
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

pub(crate) struct Setup {
    pub(crate) app: TestApp,
    /// Where the instance's ports lead.
    pub(crate) executor: Arc<PortExecutor>,
    pub(crate) _app_server: AppServer,
    /// The owner's and another tenant's tokens.
    pub(crate) owner: String,
    pub(crate) stranger: String,
    pub(crate) rid: String,
    /// Follows no redirects, so the proxy's own answers are seen.
    pub(crate) http: reqwest::Client,
}

pub(crate) async fn user(app: &TestApp, name: &str) -> String {
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

pub(crate) async fn setup(backend: Backend, configure: Option<fn(&mut ServerConfig)>) -> Setup {
    setup_with(TestApp::with(backend), configure).await
}

pub(crate) async fn setup_with(
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
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.app.base)
    }

    pub(crate) fn owner_client(&self) -> Client {
        self.app.client(Some(&self.owner))
    }

    pub(crate) fn server_addr(&self) -> SocketAddr {
        self.app.server.as_ref().unwrap().addr
    }

    /// A one-time link of the owner's to a port.
    pub(crate) async fn link(&self, port: u16) -> Value {
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

    /// The app's host on the apps' site (`ID-PORT.localhost:PORT`).
    pub(crate) fn app_host(&self, port: u16) -> String {
        format!(
            "{}-{port}.localhost:{}",
            self.rid,
            self.server_addr().port()
        )
    }

    /// What a browser of the owner's gets by following the instance page's link to the app:
    /// the proxy cookie (`name=value`) of the app's host.
    pub(crate) async fn app_cookie(&self) -> String {
        let owner = crate::app::Tenant {
            id: String::new(),
            client: self.app.client(Some(&self.owner)),
        };
        let console = crate::console_support::login(&self.app, &owner, "olga").await;
        let r = self
            .http
            .get(self.url(&format!("/instances/{}/ports/{APP_PORT}", self.rid)))
            .header("cookie", format!("gpurent_session={}", console.cookie))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        let to = r.headers()["location"].to_str().unwrap().to_owned();
        let ticket = to.split_once('?').unwrap().1;
        let r = self
            .http
            .get(self.url(&format!("/?{ticket}")))
            .header("host", self.app_host(APP_PORT))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        cookie_pair(r.headers()["set-cookie"].to_str().unwrap())
    }

    /// Opens a link: its answer's status, `Location` and `Set-Cookie`.
    pub(crate) async fn visit(&self, url: &str) -> (StatusCode, Option<String>, Option<String>) {
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
pub(crate) fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().trim().to_owned()
}
