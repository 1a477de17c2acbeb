//! The TLS listener axum serves on: TLS handshakes run in tasks of their own (a slow client
//! never holds up the others), and each connection's client certificate is kept as
//! [`PeerCert`] for the handlers, with its address ([`Peer`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::serve::{IncomingStream, Listener};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::fingerprint;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const PENDING: usize = 128;

/// TCP accepted, TLS handshaken, handed to axum.
#[derive(Debug)]
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accept: JoinHandle<()>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(PENDING);
        let acceptor = TlsAcceptor::from(config);
        let accept = tokio::spawn(async move {
            loop {
                let (stream, remote) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, say: wait rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, remote)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            local,
            ready,
            accept,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept task ended (only when aborted): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// The SHA-256 of the certificate the client presented on this connection, if any (it
/// chains to the node CA: the handshake checked that).
#[derive(Debug, Clone)]
pub struct PeerCert(pub Option<String>);

/// Who is at the other end of a connection: its address (for the audit trail and rate
/// limits), and on TLS its client certificate.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    pub cert: PeerCert,
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        let addr = *stream.remote_addr();
        let (_, connection) = stream.io().get_ref();
        let cert = PeerCert(
            connection
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| fingerprint(leaf.as_ref())),
        );
        Peer { addr, cert }
    }
}

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Peer {
            addr: *stream.remote_addr(),
            cert: PeerCert(None),
        }
    }
}

/// In a handler: the connection's client certificate; `PeerCert(None)` without one, and on a
/// plain HTTP listener.
impl<S: Send + Sync> FromRequestParts<S> for PeerCert {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<ConnectInfo<Peer>>()
            .map(|info| info.0.cert.clone())
            .unwrap_or(PeerCert(None)))
    }
}
