//! The HTTP server under the API: accepts connections within the caps, does the TLS handshake,
//! and serves each connection with hyper under the header, body and idle timeouts, so that
//! slow or greedy clients cannot hold the server's file descriptors.

mod body;
pub(crate) mod caps;
mod limits;
mod nofile;
mod watchdog;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, Request};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

pub use limits::HttpLimits;
pub use nofile::{open_files_limit, raise_open_files_limit, OpenFiles};

use crate::error::ApiError;
use crate::metrics::{ConnectionEvent, Metrics};
use crate::tls::{Peer, PeerCert};
use body::TimedBody;
use caps::{Caps, Permit, Refusal};
use watchdog::{Activity, Slow, Watched};

/// Serves `router` on `listener` (over TLS with `tls`) until `stop` turns true; then stops
/// accepting, lets requests in flight finish and returns when every connection is closed.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    limits: HttpLimits,
    metrics: Arc<Metrics>,
    apps_domain: String,
    stop: watch::Receiver<bool>,
) {
    let limits = limits.bounded();
    let apps_domain: Arc<str> = Arc::from(apps_domain);
    let cap = limits.connection_cap();
    if let Some(files) = open_files_limit() {
        if cap as u64 >= files {
            tracing::warn!(
                max_connections = cap,
                open_files = files,
                "the connection cap is above the open-files limit: accepting may fail with \
                 'too many open files'"
            );
        }
    }
    tracing::info!(
        max_connections = cap,
        max_connections_per_ip = ?limits.max_connections_per_ip,
        header_timeout = ?limits.header_timeout,
        body_timeout = ?limits.body_timeout,
        idle_timeout = ?limits.idle_timeout,
        "HTTP limits"
    );
    let caps = Caps::new(cap, limits.max_connections_per_ip, metrics.clone());
    // Each connection's task holds a receiver; all are gone when every connection is closed.
    let (closed_tx, closed_rx) = watch::channel(());
    let mut stopped = stop.clone();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say (the cap keeps below the limit, but other
                // files count too): wait rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let permit = match caps.admit(remote.ip()) {
            Ok(permit) => permit,
            Err(refusal) => {
                refuse(stream, tls.is_some(), refusal, remote);
                continue;
            }
        };
        tokio::spawn(connection(
            stream,
            remote,
            permit,
            tls.clone(),
            router.clone(),
            limits,
            metrics.clone(),
            apps_domain.clone(),
            stop.clone(),
            closed_rx.clone(),
        ));
    }
    drop(listener);
    drop(closed_rx);
    closed_tx.closed().await;
}

/// Turns a connection over a cap away at once: a 503 saying why where it is plain HTTP (in
/// one write that never waits), then closed.
fn refuse(stream: TcpStream, tls: bool, refusal: Refusal, remote: SocketAddr) {
    tracing::debug!(%remote, ?refusal, "connection refused");
    if tls {
        return;
    }
    let body = serde_json::json!({
        "error": {"code": "too_many_connections", "message": refusal.message()}
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    remote: SocketAddr,
    permit: Permit,
    tls: Option<TlsAcceptor>,
    router: Router,
    limits: HttpLimits,
    metrics: Arc<Metrics>,
    apps_domain: Arc<str>,
    stop: watch::Receiver<bool>,
    _closed: watch::Receiver<()>,
) {
    let _permit = permit;
    let accepted = tokio::time::Instant::now();
    let Some(acceptor) = tls else {
        let peer = Peer {
            addr: remote,
            cert: PeerCert(None),
        };
        return http(
            stream,
            accepted,
            peer,
            router,
            limits,
            metrics.clone(),
            apps_domain,
            stop,
        )
        .await;
    };
    // The handshake is part of the first header's time (both are due `header_timeout` after
    // the accept).
    match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let (_, session) = stream.get_ref();
            let cert = PeerCert(
                session
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|leaf| crate::tls::fingerprint(leaf.as_ref())),
            );
            let peer = Peer { addr: remote, cert };
            http(
                stream,
                accepted,
                peer,
                router,
                limits,
                metrics.clone(),
                apps_domain,
                stop,
            )
            .await;
        }
        Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
        Err(_) => {
            metrics.observe_connection(ConnectionEvent::SlowHeader);
            tracing::debug!(%remote, "TLS handshake timed out");
        }
    }
}

/// Serves HTTP/1.1 on one connection, closing it when it is slow (`watchdog`) and shutting
/// it down gracefully on stop.
#[allow(clippy::too_many_arguments)]
async fn http<IO>(
    io: IO,
    accepted: tokio::time::Instant,
    peer: Peer,
    router: Router,
    limits: HttpLimits,
    metrics: Arc<Metrics>,
    apps_domain: Arc<str>,
    mut stop: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let remote = peer.addr;
    let activity = Activity::new(limits.header_timeout, limits.idle_timeout, accepted);
    let io = TokioIo::new(Watched::new(io, activity.clone()));
    let router = TowerToHyperService::new(router);
    let requests = activity.clone();
    let body_metrics = metrics.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let guard = requests.begin_request();
        let timed_out = Arc::new(AtomicBool::new(false));
        let deadline = tokio::time::Instant::now() + limits.body_timeout;
        // A stream relayed between replicas sends its body as long as its SSH channel is
        // open: no body deadline (its peer is a replica with the tunnel's token). Nor for
        // the HTTP proxy: an upload to an app or a WebSocket takes as long as it takes.
        let streams = request.uri().path().starts_with(crate::tunnel::relay::PATH)
            || crate::proxy::is_proxied(request.uri(), request.headers(), &apps_domain);
        let mut request = if streams {
            request.map(Body::new)
        } else {
            request.map(|body| Body::new(TimedBody::new(body, deadline, timed_out.clone())))
        };
        request.extensions_mut().insert(ConnectInfo(peer.clone()));
        let answer = hyper::service::Service::call(&router, request);
        let metrics = body_metrics.clone();
        async move {
            let mut response = match answer.await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            if timed_out.load(Ordering::Relaxed) {
                metrics.observe_connection(ConnectionEvent::SlowBody);
                response = ApiError::RequestTimeout(limits.body_timeout).into_response();
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            // The connection stays busy until the response is sent in full.
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(GuardedBody {
                    body,
                    _guard: guard,
                })
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // The watchdog closes slow connections; hyper's own header timer is a backstop.
        .header_read_timeout(limits.header_timeout.saturating_add(limits.idle_timeout))
        .keep_alive(true);
    // Upgrades: agents turn a request into their tunnel (`/api/v1/agent/tunnel`).
    let mut conn = pin!(builder.serve_connection(io, service).with_upgrades());
    let mut stopping = false;
    loop {
        let deadline = activity.deadline();
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(%remote, error = %e, "connection ended");
                }
                return;
            }
            _ = sleep_until(deadline.map(|(at, _)| at)) => {
                if let Some((at, slow)) = activity.deadline() {
                    if at <= tokio::time::Instant::now() {
                        tracing::debug!(%remote, ?slow, "closing a slow connection");
                        metrics.observe_connection(match slow {
                            Slow::Header => ConnectionEvent::SlowHeader,
                            Slow::Idle => ConnectionEvent::SlowIdle,
                        });
                        return;
                    }
                }
            }
            _ = activity.changed() => {}
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A response body that keeps its connection busy (no idle deadline) until it is sent in
/// full or dropped.
struct GuardedBody {
    body: Body,
    _guard: watchdog::RequestGuard,
}

impl hyper::body::Body for GuardedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
