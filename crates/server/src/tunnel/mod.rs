//! The tunnels agents hold open to this replica (`GET /api/v1/agent/tunnel`): which node is
//! connected, and opening a stream to an instance through its node's tunnel.

pub(crate) mod route;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use gpurent_tunnel::{frame_channel, ChannelBody, Frame, FrameReceiver, FrameSender, OpenStream};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioTimer};


/// How long an agent has to answer a new stream (it may pull nothing, but docker exec and a
/// namespace entry take a moment on a loaded node).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Pings on an idle tunnel, so a vanished agent (a cut cable, a NAT that forgot it) is seen.
const KEEPALIVE: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("the node {0} has no tunnel to this control plane: its agent is not connected (is it running, and reachable?)")]
    NotConnected(String),
    /// The agent's reason, for the tenant.
    #[error("{0}")]
    Refused(String),
    #[error("the node's agent did not answer in time")]
    Timeout,
    #[error("the tunnel to the node failed: {0}")]
    Tunnel(String),
}

/// One open stream to an instance: frames to the agent and from it.
#[derive(Debug)]
pub struct Stream {
    pub tx: FrameSender,
    pub rx: FrameReceiver<Incoming>,
}

#[derive(Debug)]
struct Held {
    generation: u64,
    send: SendRequest<ChannelBody>,
}

/// The agents connected to this replica, by node name.
#[derive(Debug, Default)]
pub struct Tunnels {
    held: Mutex<HashMap<String, Held>>,
    generation: AtomicU64,
}

impl Tunnels {
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
        self.lock()
            .insert(node.clone(), Held { generation, send });
        tracing::info!(%node, "tunnel: agent connected");
        if let Err(e) = connection.await {
            tracing::info!(%node, error = %e, "tunnel: ended");
        } else {
            tracing::info!(%node, "tunnel: closed by the agent");
        }
        let mut held = self.lock();
        if held.get(&node).is_some_and(|h| h.generation == generation) {
            held.remove(&node);
        }
    }

    /// Opens a stream to an instance on `node`: sends `open`, and waits for the agent to
    /// enter the instance (or say why it cannot).
    pub async fn dial(&self, node: &str, open: OpenStream) -> Result<Stream, DialError> {
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
            let response = response.await.map_err(|e| DialError::Tunnel(e.to_string()))?;
            if !response.status().is_success() {
                return Err(DialError::Tunnel(format!(
                    "the agent answered {}",
                    response.status()
                )));
            }
            let mut rx = FrameReceiver::new(response.into_body());
            match rx.next().await {
                Ok(Some(Frame::Opened)) => Ok(rx),
                Ok(Some(Frame::Refused(why))) => Err(DialError::Refused(why)),
                Ok(other) => Err(DialError::Tunnel(format!(
                    "the agent answered {other:?} to an open"
                ))),
                Err(e) => Err(DialError::Tunnel(e.to_string())),
            }
        };
        let rx = tokio::time::timeout(OPEN_TIMEOUT, opened)
            .await
            .map_err(|_| DialError::Timeout)??;
        Ok(Stream { tx, rx })
    }

    /// Closes every tunnel (the replica stops): agents reconnect to another replica.
    pub fn close_all(&self) {
        self.lock().clear();
    }
}
