//! The tunnels agents hold open to this replica (`GET /api/v1/agent/tunnel`): which node is
//! connected, and opening a stream to an instance through its node's tunnel, here or, when
//! the agent is connected to another replica, through that replica ([`relay`]).

mod io;
pub(crate) mod relay;
pub(crate) mod route;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use gpurent_store::Store;
use gpurent_tunnel::{frame_channel, ChannelBody, Frame, FrameReceiver, FrameSender, OpenStream};
use gpurent_types::Clock;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// How long an agent has to answer a new stream (docker exec and a namespace entry take a
/// moment on a loaded node).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Pings on an idle tunnel, so a vanished agent (a cut cable, a NAT that forgot it) is seen.
const KEEPALIVE: Duration = Duration::from_secs(20);
/// How often the holder of a tunnel refreshes its record, and when a record is stale.
const REFRESH: Duration = Duration::from_secs(10);
const STALE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("the node {0} has no tunnel to the control plane: its agent is not connected (is it running, and can it reach the control plane?)")]
    NotConnected(String),
    /// The agent's reason, for the tenant.
    #[error("{0}")]
    Refused(String),
    #[error("the node's agent did not answer in time")]
    Timeout,
    #[error("the tunnel to the node failed: {0}")]
    Tunnel(String),
}

/// What a stream's frames come in: from the agent's HTTP/2 stream, or relayed by another
/// replica.
pub type StreamBody = UnsyncBoxBody<Bytes, String>;

/// One open stream to an instance: frames to the agent and from it.
#[derive(Debug)]
pub struct Stream {
    pub tx: FrameSender,
    pub rx: FrameReceiver<StreamBody>,
}

#[derive(Debug)]
struct Held {
    generation: u64,
    send: SendRequest<ChannelBody>,
    /// What another replica presents to relay a stream through this tunnel.
    relay_token: String,
}

/// The agents connected to this replica, by node name.
#[derive(Debug)]
pub struct Tunnels {
    held: Mutex<HashMap<String, Held>>,
    generation: AtomicU64,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// Where other replicas reach this one; unset: tunnels are not shared (one replica).
    advertise: OnceLock<String>,
    relay_client: OnceLock<reqwest::Client>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Tunnels {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Tunnels {
        Tunnels {
            metrics,
            held: Mutex::default(),
            generation: AtomicU64::new(0),
            store,
            clock,
            advertise: OnceLock::new(),
            relay_client: OnceLock::new(),
        }
    }

    /// Shares this replica's tunnels with the others: they relay to `url` (this replica's
    /// address as they reach it), through `client`.
    pub fn advertise(&self, url: String, client: reqwest::Client) {
        tracing::info!(%url, "tunnels shared with other replicas");
        let _ = self.advertise.set(url.trim_end_matches('/').to_owned());
        let _ = self.relay_client.set(client);
    }

    /// Whether the node's agent holds a tunnel to this replica.
    pub fn is_connected(&self, node: &str) -> bool {
        self.lock().get(node).is_some_and(|h| !h.send.is_closed())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        // A panic while holding the map leaves it usable (inserts and removes are atomic).
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves a tunnel an agent opened: HTTP/2 with this side as the client. Replaces the
    /// node's older tunnel (an agent that reconnects) and returns when the tunnel ends.
    pub async fn serve<IO>(&self, node: String, io: IO)
    where
        IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(gpurent_tunnel::STREAM_WINDOW)
            .initial_connection_window_size(gpurent_tunnel::CONNECTION_WINDOW)
            .keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true)
            .handshake::<_, ChannelBody>(io)
            .await;
        let (send, connection) = match handshake {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(%node, error = %e, "tunnel: HTTP/2 handshake with the agent failed");
                return;
            }
        };
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let relay_token = hex::encode(rand::random::<[u8; 32]>());
        self.lock().insert(
            node.clone(),
            Held {
                generation,
                send,
                relay_token: relay_token.clone(),
            },
        );
        tracing::info!(%node, "tunnel: agent connected");
        self.metrics.ssh.tunnels.fetch_add(1, Ordering::Relaxed);
        // Other replicas learn where the tunnel is while it is open.
        let record = async {
            let Some(url) = self.advertise.get() else {
                return std::future::pending().await;
            };
            loop {
                if let Err(e) = self
                    .store
                    .hold_tunnel(&node, url, &relay_token, self.clock.now())
                    .await
                {
                    tracing::warn!(%node, error = %e, "tunnel: cannot record its holder");
                }
                tokio::time::sleep(REFRESH).await;
            }
        };
        tokio::select! {
            ended = connection => match ended {
                Ok(()) => tracing::info!(%node, "tunnel: closed by the agent"),
                Err(e) => tracing::info!(%node, error = %e, "tunnel: ended"),
            },
            () = record => {}
        }
        crate::metrics::SshCounts::down(&self.metrics.ssh.tunnels);
        let mine = {
            let mut held = self.lock();
            let mine = held.get(&node).is_some_and(|h| h.generation == generation);
            if mine {
                held.remove(&node);
            }
            mine
        };
        if mine && self.advertise.get().is_some() {
            let _ = self.store.release_tunnel(&node, &relay_token).await;
        }
    }

    /// Whether `token` is the relay token of the node's tunnel here.
    fn relay_token_matches(&self, node: &str, token: &str) -> bool {
        self.lock().get(node).is_some_and(|h| {
            // Equal lengths (hex of 32 bytes) and a compare that does not stop early.
            h.relay_token.len() == token.len()
                && h.relay_token
                    .bytes()
                    .zip(token.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        })
    }

    /// Opens a stream to an instance on `node`: through its tunnel here, or through the
    /// replica holding it.
    pub async fn dial(&self, node: &str, open: OpenStream) -> Result<Stream, DialError> {
        if self.is_connected(node) {
            return self.dial_here(node, open).await;
        }
        let since = self.clock.now()
            - chrono::Duration::from_std(STALE).unwrap_or(chrono::Duration::seconds(30));
        let holder = match self.store.tunnel_holder(node, since).await {
            Ok(holder) => holder,
            Err(e) => {
                tracing::warn!(%node, error = %e, "tunnel: cannot look up the holder");
                None
            }
        };
        match (holder, self.advertise.get(), self.relay_client.get()) {
            (Some(holder), Some(me), Some(client)) if holder.replica_url != *me => {
                relay::dial(client, node, &holder, open).await
            }
            _ => Err(DialError::NotConnected(node.to_owned())),
        }
    }

    /// Opens a stream through the node's tunnel to this replica: sends `open`, and waits for
    /// the agent to enter the instance (or say why it cannot).
    async fn dial_here(&self, node: &str, open: OpenStream) -> Result<Stream, DialError> {
        let mut send = self
            .lock()
            .get(node)
            .map(|h| h.send.clone())
            .ok_or_else(|| DialError::NotConnected(node.to_owned()))?;
        let (tx, body) = frame_channel();
        let request = hyper::Request::post("http://agent/stream")
            .body(body)
            .map_err(|e| DialError::Tunnel(e.to_string()))?;
        let opened = async {
            send.ready()
                .await
                .map_err(|_| DialError::NotConnected(node.to_owned()))?;
            let response = send.send_request(request);
            tx.send(Frame::Open(open))
                .await
                .map_err(|e| DialError::Tunnel(e.to_string()))?;
            let response = response
                .await
                .map_err(|e| DialError::Tunnel(e.to_string()))?;
            if !response.status().is_success() {
                return Err(DialError::Tunnel(format!(
                    "the agent answered {}",
                    response.status()
                )));
            }
            let body = response
                .into_body()
                .map_err(|e| e.to_string())
                .boxed_unsync();
            opened(FrameReceiver::new(body)).await
        };
        let rx = tokio::time::timeout(OPEN_TIMEOUT, opened)
            .await
            .map_err(|_| DialError::Timeout)??;
        Ok(Stream { tx, rx })
    }
}

/// Reads the agent's first frame: in, or why not.
async fn opened(mut rx: FrameReceiver<StreamBody>) -> Result<FrameReceiver<StreamBody>, DialError> {
    match rx.next().await {
        Ok(Some(Frame::Opened)) => Ok(rx),
        Ok(Some(Frame::Refused(why))) => Err(DialError::Refused(why)),
        Ok(other) => Err(DialError::Tunnel(format!(
            "the agent answered {other:?} to an open"
        ))),
        Err(e) => Err(DialError::Tunnel(e.to_string())),
    }
}
