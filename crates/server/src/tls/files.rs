//! Certificate files: the served certificate and its key checked to belong together, SHA-256
//! fingerprints, and the self-signed certificate of `--tls-self-signed` (PEM loading and
//! owner-only writes are `gpurent_types::keyfile`'s).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpurent_types::keyfile::{load_certs, load_private_key, write_private};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

use super::{provider, TlsError};

/// The lowercase hex SHA-256 of a certificate's DER: what `--tls-fingerprint` pins.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// A certificate chain and its private key, checked to belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(cert)?;
    let private = load_private_key(key)?;
    let pair = |source| TlsError::BadPair {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    };
    let signing = provider()
        .key_provider
        .load_private_key(private)
        .map_err(pair)?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(pair)?;
    Ok(Arc::new(certified))
}

/// The certificate of `--tls-self-signed`, kept in the data dir.
#[derive(Debug, Clone)]
pub struct SelfSigned {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub fingerprint: String,
    /// Whether this start generated it (else an earlier one did).
    pub created: bool,
}

/// Generates a key and a self-signed certificate for `names` (IP addresses or host names)
/// into `dir` on first use (`tls.crt`, `tls.key` mode 0600), reuses them afterwards, and writes
/// the certificate's SHA-256 to `tls.fingerprint`.
pub fn self_signed(dir: &Path, names: &[String]) -> Result<SelfSigned, TlsError> {
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    let created = !(cert.exists() && key.exists());
    if created {
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
            path: dir.to_owned(),
            source,
        })?;
        let pair = rcgen::KeyPair::generate().map_err(TlsError::Generate)?;
        let mut params =
            rcgen::CertificateParams::new(names.to_vec()).map_err(TlsError::Generate)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "gpurent control plane");
        let generated = params.self_signed(&pair).map_err(TlsError::Generate)?;
        write_private(&key, pair.serialize_pem().as_bytes())?;
        write_private(&cert, generated.pem().as_bytes())?;
    }
    let leaf = load_certs(&cert)?;
    let fingerprint = fingerprint(leaf[0].as_ref());
    let fp_path = dir.join("tls.fingerprint");
    std::fs::write(&fp_path, format!("{fingerprint}\n")).map_err(|source| TlsError::Write {
        path: fp_path,
        source,
    })?;
    Ok(SelfSigned {
        cert,
        key,
        fingerprint,
        created,
    })
}
