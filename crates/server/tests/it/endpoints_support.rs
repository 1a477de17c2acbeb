//! What the endpoints' tests share: an executor whose every instance is a real HTTP server of
//! the test on loopback (the "replica"), reached through the node's tunnel at any port; the app
//! it serves (sleeps as asked, says which replica answered); and a control plane with a node of
//! it and a tenant.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use gpurent_agent::entry::{
    Entered, EntryControl, EntryError, EntryKind, EntryRequest, ExitStatus,
};
use gpurent_agent::executor::SimExecutor;
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::reconcile::Observed;
use gpurent_agent::{AgentError, Executor};
use gpurent_store::Backend;
use gpurent_types::agent::Assignment;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};

use crate::app::{Client, TestApp};

/// The sim executor, but each instance also serves the test's app on a port of its own.
#[derive(Debug, Default)]
pub(crate) struct ReplicaExecutor {
    sim: SimExecutor,
    apps: Mutex<HashMap<String, (SocketAddr, tokio::task::JoinHandle<()>)>>,
}

impl ReplicaExecutor {
    /// Kills a replica's app at once (its connections cut), as a crash would.
    pub(crate) fn kill(&self, reservation_id: &str) {
        if let Some((_, task)) = self.apps.lock().unwrap().remove(reservation_id) {
            task.abort();
        }
    }

    /// The replicas whose apps serve now.
    pub(crate) fn serving(&self) -> usize {
        self.apps.lock().unwrap().len()
    }
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
impl Executor for ReplicaExecutor {
    fn name(&self) -> &'static str {
        self.sim.name()
    }
    async fn start(
        &self,
        a: &Assignment,
        volume: Option<&std::path::Path>,
    ) -> Result<(), AgentError> {
        self.sim.start(a, volume).await?;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let replica = Replica {
            id: a.reservation_id.clone(),
            tag: a.env.get("APP_TAG").cloned().unwrap_or_default(),
            healthy_after: Duration::from_millis(
                a.env
                    .get("APP_HEALTHY_AFTER_MS")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            ),
            never_healthy: a.env.get("APP_HEALTH").is_some_and(|v| v == "never"),
            started: Instant::now(),
        };
        let replica = Arc::new(replica);
        // Its connections die with it (a JoinSet aborts its tasks when dropped).
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let replica = Arc::clone(&replica);
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |r| app(Arc::clone(&replica), r));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        self.apps
            .lock()
            .unwrap()
            .insert(a.reservation_id.clone(), (addr, task));
        Ok(())
    }
    async fn stop(&self, id: &str, grace: Option<Duration>) -> Result<(), AgentError> {
        self.kill(id);
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
        let addr = self.apps.lock().unwrap().get(id).map(|(addr, _)| *addr);
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

/// One replica's app.
#[derive(Debug)]
struct Replica {
    id: String,
    tag: String,
    healthy_after: Duration,
    never_healthy: bool,
    started: Instant,
}

type AppBody = BoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> AppBody {
    Full::new(b.into()).boxed()
}

/// A WebSocket's upgrade is echoed; `/health`: 200 once it is up (`APP_HEALTHY_AFTER_MS`), never with `APP_HEALTH=never`;
/// `/fail`: 500; `/stream`: three server-sent events 100 ms apart; anything else: sleeps
/// `?ms=N` and says which replica answered.
async fn app(
    replica: Arc<Replica>,
    mut request: hyper::Request<Incoming>,
) -> Result<hyper::Response<AppBody>, Infallible> {
    let path = request.uri().path().to_owned();
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
                crate::proxy_support::ws_echo(TokioIo::new(upgraded)).await;
            }
        });
        return Ok(hyper::Response::builder()
            .status(101)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header(
                "sec-websocket-accept",
                crate::proxy_support::accept_key(&key),
            )
            .body(full(""))
            .unwrap());
    }
    let reply = |status: u16, body: String| {
        Ok(hyper::Response::builder()
            .status(status)
            .body(full(body))
            .unwrap())
    };
    match path.as_str() {
        "/health" => {
            if replica.never_healthy || replica.started.elapsed() < replica.healthy_after {
                return reply(503, "starting".into());
            }
            reply(200, "ok".into())
        }
        "/fail" => reply(500, "the app failed".into()),
        "/stream" => {
            let events = futures::stream::unfold(0, |i| async move {
                if i == 3 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                Some((
                    Ok::<_, Infallible>(Frame::data(Bytes::from(format!("data: {i}\n\n")))),
                    i + 1,
                ))
            });
            Ok(hyper::Response::builder()
                .header("content-type", "text/event-stream")
                .body(StreamBody::new(events).boxed())
                .unwrap())
        }
        _ => {
            let ms: u64 = request
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("ms="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let body = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .unwrap_or(0);
            reply(
                200,
                json!({"replica": replica.id, "tag": replica.tag, "path": path, "body": body})
                    .to_string(),
            )
        }
    }
}

/// A control plane with one node of four GPUs whose instances are [`ReplicaExecutor`]'s, and
/// a tenant with credit.
pub(crate) struct EndpointSetup {
    pub(crate) app: TestApp,
    pub(crate) executor: Arc<ReplicaExecutor>,
    pub(crate) token: String,
    pub(crate) http: reqwest::Client,
}

pub(crate) async fn setup(backend: Backend) -> EndpointSetup {
    setup_with(TestApp::with(backend)).await
}

pub(crate) async fn setup_with(builder: crate::app::TestAppBuilder) -> EndpointSetup {
    let mut app = builder.start().await;
    let executor = Arc::new(ReplicaExecutor::default());
    let gpus = Arc::new(SimGpus::parse("4xRTX4090", "node-0").unwrap());
    app.add_node_running("node-0", gpus, executor.clone()).await;
    let token = crate::proxy_support::user(&app, "erin").await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    EndpointSetup {
        app,
        executor,
        token,
        http,
    }
}

impl EndpointSetup {
    /// Joins another node of these GPUs (`2xRTX4090`) whose instances are replicas' apps.
    pub(crate) async fn add_node(&mut self, name: &str, spec: &str) -> Arc<ReplicaExecutor> {
        let executor = Arc::new(ReplicaExecutor::default());
        let gpus = Arc::new(SimGpus::parse(spec, name).unwrap());
        self.app
            .add_node_running(name, gpus, executor.clone())
            .await;
        executor
    }

    pub(crate) fn client(&self) -> Client {
        self.app.client(Some(&self.token))
    }

    /// Creates an endpoint `name` of one RTX 4090 per replica serving the app at port 8000,
    /// with these scaling settings over the defaults; returns it.
    pub(crate) async fn create(&self, name: &str, env: Value, scaling: Value) -> Value {
        let (status, e) = self
            .client()
            .post(
                "/api/v1/endpoints",
                &json!({"name": name, "gpu_type": "rtx4090", "command": ["app"], "port": 8000,
                        "env": env, "scaling": scaling}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{e}");
        e
    }

    /// A new key of the endpoint.
    pub(crate) async fn key(&self, name: &str) -> String {
        let (status, k) = self
            .client()
            .post(&format!("/api/v1/endpoints/{name}/keys"), &json!({}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{k}");
        k["key"].as_str().unwrap().to_owned()
    }

    /// The control plane's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.app.base.trim_start_matches("http://").parse().unwrap()
    }

    /// A request of `method` to `path` of the endpoint at `/e/NAME` (public): status and body.
    pub(crate) async fn send(&self, method: &str, name: &str, path: &str) -> (StatusCode, String) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        match self
            .http
            .request(method, format!("{}/e/{name}{path}", self.app.base))
            .send()
            .await
        {
            Ok(r) => {
                let status = r.status();
                (status, r.text().await.unwrap_or_default())
            }
            Err(e) => (StatusCode::IM_A_TEAPOT, e.to_string()),
        }
    }

    /// GET `path` of the endpoint at `/e/NAME`, with the key.
    pub(crate) async fn call(&self, name: &str, path: &str, key: &str) -> (StatusCode, String) {
        let r = self
            .http
            .get(format!("{}/e/{name}{path}", self.app.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.text().await.unwrap())
    }

    pub(crate) async fn get(&self, name: &str) -> Value {
        let (status, e) = self
            .client()
            .get(&format!("/api/v1/endpoints/{name}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{e}");
        e
    }

    /// The endpoint's live replicas as `get` shows them.
    pub(crate) async fn replicas(&self, name: &str) -> Vec<Value> {
        self.get(name).await["replicas"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}
