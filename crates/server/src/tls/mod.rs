//! Transport security of the control plane: TLS 1.3 only (rustls with ring), the server
//! certificate reloaded from its files without a restart, and the node CA behind mutual TLS.

mod ca;
mod files;
mod peer;
mod reload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use rustls::RootCertStore;

pub use ca::{NodeCa, SignedNodeCert};
pub use files::{fingerprint, load_certified_key, self_signed, SelfSigned};
pub use peer::{Peer, PeerCert};
pub use reload::ReloadingResolver;

/// How often the certificate files are checked for a new certificate.
pub const DEFAULT_RELOAD_EVERY: Duration = Duration::from_secs(2);

/// TLS on the control plane's listener: its certificate files and the CA of node certificates.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The files are polled this often; a new valid pair replaces the served certificate.
    pub reload_every: Duration,
    /// Signs node certificates at registration and verifies them on each connection.
    pub node_ca: Arc<NodeCa>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A certificate or key file that cannot be read, used or written.
    #[error(transparent)]
    KeyFile(#[from] gpurent_types::keyfile::KeyFileError),
    #[error("the certificate {cert} and the key {key} do not form a usable pair")]
    BadPair {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot generate a certificate")]
    Generate(#[source] rcgen::Error),
    #[error("cannot build the TLS configuration")]
    Config(#[source] rustls::Error),
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(String),
    #[error("the node CA's key: {0}")]
    Sealed(String),
    /// A secret every replica shares (the node CA, the self-signed certificate).
    #[error(transparent)]
    Shared(#[from] crate::shared_keys::SharedKeyError),
}

/// The one crypto provider: ring (no aws-lc-rs, which needs cmake to build).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The listener's rustls configuration: TLS 1.3 only; a client certificate is optional at the
/// TLS layer (browsers and the CLI have none) but, when given, must chain to the node CA.
pub fn server_config(
    resolver: Arc<dyn ResolvesServerCert>,
    node_ca: &NodeCa,
) -> Result<rustls::ServerConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    roots
        .add(node_ca.cert_der().clone())
        .map_err(TlsError::Config)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Verifier(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Config)?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
