//! Who is at the other end of a connection ([`Peer`]: its address and, on TLS, its client
//! certificate), as the server puts it in each request for the handlers.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

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
