//! Certificate files: the served certificate and its key checked to belong together, SHA-256
//! fingerprints, and the self-signed certificate of `--tls-self-signed`, one for every replica
//! (PEM loading and owner-only writes are `gpurent_types::keyfile`'s).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use gpurent_store::SharedKeyStore;
use gpurent_types::keyfile::{load_certs, load_private_key, write_private};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

use super::{provider, TlsError};
use crate::secrets::KeyProvider;
use crate::shared_keys::{load_or_store, Found, Origin, SELF_SIGNED_TLS};

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
    /// Whether this start generated it (else an earlier one, or another replica, did).
    pub created: bool,
}

/// What the database keeps (sealed): the certificate and its key, in PEM.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    cert_pem: String,
    key_pem: String,
}

fn stored(bytes: &[u8]) -> Result<Stored, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("not a stored certificate: {e}"))
}

/// The certificate's SHA-256, as messages name it.
fn identify(bytes: &[u8]) -> Result<String, String> {
    let der = CertificateDer::from_pem_slice(stored(bytes)?.cert_pem.as_bytes())
        .map_err(|e| format!("the certificate: {e}"))?;
    Ok(format!("SHA-256 {}", fingerprint(der.as_ref())))
}

/// One self-signed certificate for every replica, from the database (`shared_keys`): the first
/// start stores the one in `dir` (`tls.crt`, `tls.key`), else a new one for `names` (IP
/// addresses or host names); `dir` gets a copy (`tls.key` mode 0600) that the served
/// certificate is loaded from, and the certificate's SHA-256 in `tls.fingerprint`. A pair in
/// `dir` that is not the database's is refused.
pub async fn self_signed(
    store: &dyn SharedKeyStore,
    master: &dyn KeyProvider,
    dir: &Path,
    names: &[String],
    now: DateTime<Utc>,
) -> Result<SelfSigned, TlsError> {
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let read = |path: &Path| {
        crate::shared_keys::read_if_there(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let found = match (read(&cert)?, read(&key)?) {
        (Some(cert_pem), Some(key_pem)) => Some(Found {
            path: cert.clone(),
            value: serde_json::to_vec(&Stored {
                cert_pem: String::from_utf8_lossy(&cert_pem).into_owned(),
                key_pem: String::from_utf8_lossy(&key_pem).into_owned(),
            })
            .map_err(|e| TlsError::Sealed(e.to_string()))?,
        }),
        _ => None,
    };
    let had_copy = found.is_some();
    let make = || {
        let pair = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params =
            rcgen::CertificateParams::new(names.to_vec()).map_err(|e| e.to_string())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "gpurent control plane");
        let generated = params.self_signed(&pair).map_err(|e| e.to_string())?;
        serde_json::to_vec(&Stored {
            cert_pem: generated.pem(),
            key_pem: pair.serialize_pem(),
        })
        .map_err(|e| e.to_string())
    };
    let loaded = load_or_store(store, master, SELF_SIGNED_TLS, found, identify, make, now).await?;
    if !had_copy {
        let pair = stored(&loaded.value).map_err(TlsError::Sealed)?;
        write_private(&key, pair.key_pem.as_bytes())?;
        write_private(&cert, pair.cert_pem.as_bytes())?;
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
        created: loaded.origin == Origin::Made,
    })
}
