//! The client side of TLS, for the agent and the CLI: trust a private CA (`--ca-cert`) or pin
//! the control plane's certificate by its SHA-256 (`--tls-fingerprint`), and present the
//! node's client certificate (mutual TLS); TLS 1.3 only, rustls with ring.

use std::path::PathBuf;
use std::sync::Arc;

use gpurent_types::keyfile::{load_certs, load_private_key, KeyFileError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    #[error("{path} holds no usable PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("not a SHA-256 fingerprint (64 hex digits, colons allowed): {0}")]
    BadFingerprint(String),
    #[error("no trusted CA: none in the system store; pass --ca-cert or --tls-fingerprint")]
    NoRoots,
    #[error("cannot build the TLS configuration")]
    Config(#[source] rustls::Error),
    #[error("cannot build the HTTPS client: {0}")]
    Client(String),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make the node's key or certificate request")]
    Generate(#[source] rcgen::Error),
}

/// How a client trusts the control plane, and the certificate it presents.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// A PEM file of the CA (or the self-signed certificate) to trust.
    pub ca_cert: Option<PathBuf>,
    /// Accept exactly the certificate with this SHA-256 (lowercase hex), whoever signed it.
    pub fingerprint: Option<String>,
    /// The client certificate and its key (PEM files), for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl ClientTls {
    /// Checks and normalises a fingerprint: `AB:CD:...` and `abcd...` are the same.
    pub fn parse_fingerprint(text: &str) -> Result<String, TlsError> {
        let hex: String = text
            .trim()
            .chars()
            .filter(|c| *c != ':')
            .collect::<String>()
            .to_ascii_lowercase();
        if hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            Ok(hex)
        } else {
            Err(TlsError::BadFingerprint(text.to_owned()))
        }
    }

    /// The rustls configuration these settings make.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let provider = provider();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Config)?;
        let builder = match &self.fingerprint {
            Some(pin) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedCert {
                    sha256: Self::parse_fingerprint(pin)?,
                    algorithms: provider.signature_verification_algorithms,
                })),
            None => builder.with_root_certificates(self.roots()?),
        };
        match &self.client_cert {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => builder
                .with_client_auth_cert(load_certs(cert)?, load_private_key(key)?)
                .map_err(TlsError::Config),
        }
    }

    /// A reqwest client over [`ClientTls::client_config`].
    pub fn reqwest_builder(&self) -> Result<reqwest::ClientBuilder, TlsError> {
        Ok(reqwest::Client::builder().use_preconfigured_tls(self.client_config()?))
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        match &self.ca_cert {
            Some(path) => {
                for cert in load_certs(path)? {
                    roots
                        .add(cert)
                        .map_err(|_| TlsError::NoCertificate { path: path.clone() })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(TlsError::NoRoots);
                }
            }
        }
        Ok(roots)
    }
}

/// The one crypto provider: ring (aws-lc-rs needs cmake to build).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The lowercase hex SHA-256 of a certificate's DER.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// A new key for the node and a CSR for it: (key PEM, CSR PEM). The key stays on the node.
pub fn new_key_and_csr(name: &str) -> Result<(String, String), TlsError> {
    let key = rcgen::KeyPair::generate().map_err(TlsError::Generate)?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let csr = params.serialize_request(&key).map_err(TlsError::Generate)?;
    Ok((key.serialize_pem(), csr.pem().map_err(TlsError::Generate)?))
}

/// Accepts exactly one certificate, by its SHA-256, and still checks that the server holds
/// its key (the handshake signature), so a pinned certificate cannot be replayed.
#[derive(Debug)]
struct PinnedCert {
    sha256: String,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = fingerprint(end_entity.as_ref());
        if presented == self.sha256 {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the control plane's certificate has SHA-256 {presented}, not the pinned {}",
                self.sha256
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--ca-cert` naming a file that is not PEM fails at start, naming the file and the fault.
    #[test]
    fn a_ca_file_that_is_not_pem_says_why() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let tls = ClientTls {
            ca_cert: Some(ca.clone()),
            ..ClientTls::default()
        };
        let Err(e) = tls.client_config() else {
            panic!("a CA file of garbage was accepted");
        };
        let message = e.to_string();
        assert!(
            message.contains(&ca.display().to_string()) && message.contains("not valid PEM"),
            "{message}"
        );
    }

    #[test]
    fn fingerprints_are_normalised() {
        let hex = "ab".repeat(32);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(
            ClientTls::parse_fingerprint(&colons).ok(),
            Some(hex.clone())
        );
        assert_eq!(ClientTls::parse_fingerprint(&hex).ok(), Some(hex));
        assert!(ClientTls::parse_fingerprint("abc").is_err());
    }

    #[test]
    fn a_csr_is_made_for_a_new_key() {
        let (key, csr) = new_key_and_csr("node-1").expect("csr");
        assert!(key.contains("PRIVATE KEY"));
        assert!(csr.contains("CERTIFICATE REQUEST"));
    }
}
