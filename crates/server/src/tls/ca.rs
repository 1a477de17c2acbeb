//! The control plane's own CA, shared by every replica (`shared_keys`): it signs each node's
//! certificate from the node's CSR at registration, so a node's key never leaves it.

use std::path::Path;

use chrono::{DateTime, Datelike, Utc};
use gpurent_store::SharedKeyStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};

use gpurent_types::keyfile::write_private;

use super::files::fingerprint;
use super::TlsError;
use crate::secrets::{open_bytes, KeyProvider};
use crate::shared_keys::{self, Found, Origin, NODE_CA};

/// Bound to the CA key an older version sealed into `ca.key.sealed`.
const CA_KEY_PURPOSE: &[u8] = b"gpurent-node-ca-key-v1";

/// How long a node certificate is valid.
pub const NODE_CERT_DAYS: i64 = 90;

/// The CA of node certificates.
pub struct NodeCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl std::fmt::Debug for NodeCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCa")
            .field("fingerprint", &fingerprint(self.cert_der.as_ref()))
            .finish_non_exhaustive()
    }
}

/// A node certificate just signed.
#[derive(Debug, Clone)]
pub struct SignedNodeCert {
    pub pem: String,
    /// Its SHA-256: the store keeps it, and each connection's certificate must match it.
    pub sha256: String,
}

#[derive(Debug, thiserror::Error)]
#[error("the certificate signing request is not usable: {0}")]
pub struct BadCsr(String);

/// What the database keeps (sealed): the CA's certificate and key, in PEM.
#[derive(Serialize, Deserialize)]
struct Stored {
    cert_pem: String,
    key_pem: String,
}

impl Stored {
    fn to_bytes(&self) -> Result<Vec<u8>, String> {
        serde_json::to_vec(self).map_err(|e| e.to_string())
    }

    fn from_bytes(bytes: &[u8]) -> Result<Stored, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a stored CA: {e}"))
    }
}

/// The certificate's SHA-256, as messages name a CA.
fn identify(bytes: &[u8]) -> Result<String, String> {
    let stored = Stored::from_bytes(bytes)?;
    let der = CertificateDer::from_pem_slice(stored.cert_pem.as_bytes())
        .map_err(|e| format!("the CA's certificate: {e}"))?;
    Ok(format!("certificate SHA-256 {}", fingerprint(der.as_ref())))
}

/// A new CA, valid for a century.
fn generate() -> Result<Vec<u8>, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gpurent node CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    Stored {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
    .to_bytes()
}

/// The CA an older version kept in `dir`: `ca.pem` and its key, sealed (`ca.key.sealed`) or,
/// older still, plain (`ca.key`). `None` without both a certificate and a key.
fn found_in(dir: &Path, master: &dyn KeyProvider) -> Result<Option<Found>, TlsError> {
    let cert_path = dir.join("ca.pem");
    let sealed_path = dir.join("ca.key.sealed");
    let plain_path = dir.join("ca.key");
    let read = |path: &Path| {
        shared_keys::read_if_there(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let Some(cert) = read(&cert_path)? else {
        return Ok(None);
    };
    let key = match (read(&sealed_path)?, read(&plain_path)?) {
        (Some(sealed), _) => {
            let sealed = String::from_utf8_lossy(&sealed).into_owned();
            open_bytes(master, &sealed, CA_KEY_PURPOSE)
                .map_err(|e| TlsError::Sealed(format!("{}: {e}", sealed_path.display())))?
        }
        (None, Some(plain)) => plain,
        (None, None) => return Ok(None),
    };
    let text = |bytes: Vec<u8>, path: &Path| {
        String::from_utf8(bytes)
            .map_err(|_| TlsError::Sealed(format!("{} is not PEM", path.display())))
    };
    let value = Stored {
        cert_pem: text(cert, &cert_path)?,
        key_pem: text(key, &sealed_path)?,
    }
    .to_bytes()
    .map_err(TlsError::Sealed)?;
    Ok(Some(Found {
        path: cert_path,
        value,
    }))
}

impl NodeCa {
    /// The CA every replica shares, from the database; the first start stores the one its data
    /// dir holds (an older version's), else a new one. A data dir's CA that is not the
    /// database's is refused, never switched to. `ca.pem` in `dir` is (re)written to match.
    pub async fn load_or_create(
        store: &dyn SharedKeyStore,
        master: &dyn KeyProvider,
        dir: &Path,
        now: DateTime<Utc>,
    ) -> Result<NodeCa, TlsError> {
        let found = found_in(dir, master)?;
        let loaded =
            shared_keys::load_or_store(store, master, NODE_CA, found, identify, generate, now)
                .await?;
        let stored = Stored::from_bytes(&loaded.value).map_err(TlsError::Sealed)?;
        let ca = NodeCa::from_pem(&stored.cert_pem, &stored.key_pem)?;
        let cert_path = dir.join("ca.pem");
        if shared_keys::read_if_there(&cert_path)
            .ok()
            .flatten()
            .as_deref()
            != Some(stored.cert_pem.as_bytes())
        {
            write_private(&cert_path, stored.cert_pem.as_bytes())?;
        }
        // A plain key left by an older version is in the database now, sealed: not on disk.
        let plain_path = dir.join("ca.key");
        if loaded.origin == Origin::Imported && plain_path.exists() {
            std::fs::remove_file(&plain_path).map_err(|source| TlsError::Write {
                path: plain_path,
                source,
            })?;
        }
        Ok(ca)
    }

    /// A CA from its certificate and key.
    fn from_pem(cert_pem: &str, key_pem: &str) -> Result<NodeCa, TlsError> {
        let key = rcgen::KeyPair::from_pem(key_pem).map_err(TlsError::Generate)?;
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| TlsError::Sealed(format!("the CA's certificate: {e}")))?;
        // rcgen signs with an issuer built from the CA's parameters and key; the DER that
        // agents trust is the stored one.
        let issuer = rcgen::CertificateParams::from_ca_cert_pem(cert_pem)
            .and_then(|params| params.self_signed(&key))
            .map_err(TlsError::Generate)?;
        Ok(NodeCa {
            cert_pem: cert_pem.to_owned(),
            cert_der,
            issuer,
            key,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Checks that a CSR parses and carries a valid self-signature.
    pub fn check_csr(csr_pem: &str) -> Result<(), BadCsr> {
        rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map(|_| ())
            .map_err(|e| BadCsr(e.to_string()))
    }

    /// Signs the CSR's public key into a client certificate for `node_id` (its common name
    /// and only name, whatever the CSR asked for), valid from `now` for [`NODE_CERT_DAYS`].
    pub fn sign(
        &self,
        csr_pem: &str,
        node_id: &str,
        now: DateTime<Utc>,
    ) -> Result<SignedNodeCert, BadCsr> {
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| BadCsr(e.to_string()))?;
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, node_id);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        let start = now - chrono::Duration::hours(1);
        let end = now + chrono::Duration::days(NODE_CERT_DAYS);
        params.not_before = rcgen::date_time_ymd(start.year(), month(start), day(start));
        params.not_after = rcgen::date_time_ymd(end.year(), month(end), day(end));
        let mut serial: [u8; 16] = rand::random();
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        csr.params = params;
        let cert = csr
            .signed_by(&self.issuer, &self.key)
            .map_err(|e| BadCsr(e.to_string()))?;
        Ok(SignedNodeCert {
            sha256: fingerprint(cert.der().as_ref()),
            pem: cert.pem(),
        })
    }
}

fn month(t: DateTime<Utc>) -> u8 {
    u8::try_from(t.month()).unwrap_or(1)
}

fn day(t: DateTime<Utc>) -> u8 {
    u8::try_from(t.day()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use rustls::pki_types::UnixTime;
    use rustls::server::WebPkiClientVerifier;

    use gpurent_store::SharedKeyStore;

    use super::*;

    fn csr(name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[tokio::test]
    async fn a_node_certificate_chains_to_the_ca_and_names_the_node_only() {
        let (_db, store) = gpurent_store::testing::TestDatabase::sqlite_store()
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let master = crate::secrets::LocalKey::from_bytes(&[5; 32]);
        let ca = NodeCa::load_or_create(&store, &master, dir.path(), Utc::now())
            .await
            .unwrap();
        // The same CA on the next start, and for a replica with another data dir; its key
        // is in the database only, sealed.
        let again = NodeCa::load_or_create(&store, &master, dir.path(), Utc::now())
            .await
            .unwrap();
        assert_eq!(ca.cert_der(), again.cert_der());
        let replica = tempfile::tempdir().unwrap();
        let shared = NodeCa::load_or_create(&store, &master, replica.path(), Utc::now())
            .await
            .unwrap();
        assert_eq!(ca.cert_der(), shared.cert_der());
        assert_eq!(
            std::fs::read_to_string(replica.path().join("ca.pem")).unwrap(),
            ca.cert_pem()
        );
        for file in ["ca.key", "ca.key.sealed"] {
            assert!(!dir.path().join(file).exists(), "{file}");
        }
        let sealed = store
            .shared_key(crate::shared_keys::NODE_CA.name)
            .await
            .unwrap()
            .unwrap();
        assert!(!sealed.contains("PRIVATE KEY") && !sealed.contains("CERTIFICATE"));
        // Another master key cannot open it, and says so.
        let other_master = crate::secrets::LocalKey::from_bytes(&[6; 32]);
        let err = NodeCa::load_or_create(&store, &other_master, replica.path(), Utc::now())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sealed with master key local:") && err.contains("given master key"),
            "{err}"
        );
        let signed = ca
            .sign(&csr("admin.example"), "node-42", Utc::now())
            .unwrap();
        let der = rustls_pemfile::certs(&mut signed.pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(signed.sha256, fingerprint(der.as_ref()));
        let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
        let cn: Vec<_> = parsed
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(cn, vec!["node-42".to_owned()]);
        assert!(parsed.subject_alternative_name().unwrap().is_none());

        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), super::super::provider())
                .build()
                .unwrap();
        verifier
            .verify_client_cert(&der, &[], UnixTime::now())
            .expect("a node certificate the CA signed is accepted");

        // Another CA's certificate is not.
        let (_other_db, other_store) = gpurent_store::testing::TestDatabase::sqlite_store()
            .await
            .unwrap();
        let other = tempfile::tempdir().unwrap();
        let stranger = NodeCa::load_or_create(&other_store, &master, other.path(), Utc::now())
            .await
            .unwrap()
            .sign(&csr("x"), "node-42", Utc::now())
            .unwrap();
        let der = rustls_pemfile::certs(&mut stranger.pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        assert!(verifier
            .verify_client_cert(&der, &[], UnixTime::now())
            .is_err());
    }

    /// What an older version left: `ca.pem` and the key sealed in `ca.key.sealed` (or plain
    /// in `ca.key`): imported into the database; another data dir's CA is then refused.
    #[tokio::test]
    async fn a_data_dir_ca_is_imported_and_a_different_one_refused() {
        let (_db, store) = gpurent_store::testing::TestDatabase::sqlite_store()
            .await
            .unwrap();
        let master = crate::secrets::LocalKey::from_bytes(&[5; 32]);
        let old = Stored::from_bytes(&generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), &old.cert_pem).unwrap();
        std::fs::write(dir.path().join("ca.key"), &old.key_pem).unwrap();
        let ca = NodeCa::load_or_create(&store, &master, dir.path(), Utc::now())
            .await
            .unwrap();
        assert_eq!(
            ca.cert_pem(),
            old.cert_pem,
            "the data dir's CA, not a new one"
        );
        assert!(
            !dir.path().join("ca.key").exists(),
            "the plain key is removed"
        );

        let sealed_dir = tempfile::tempdir().unwrap();
        let other = Stored::from_bytes(&generate().unwrap()).unwrap();
        std::fs::write(sealed_dir.path().join("ca.pem"), &other.cert_pem).unwrap();
        let sealed =
            crate::secrets::seal_bytes(&master, other.key_pem.as_bytes(), CA_KEY_PURPOSE).unwrap();
        std::fs::write(sealed_dir.path().join("ca.key.sealed"), sealed).unwrap();
        let err = NodeCa::load_or_create(&store, &master, sealed_dir.path(), Utc::now())
            .await
            .unwrap_err()
            .to_string();
        let path = sealed_dir.path().join("ca.pem").display().to_string();
        assert!(
            err.contains("the node CA in")
                && err.contains(&path)
                && err.contains(&identify(&other.to_bytes().unwrap()).unwrap())
                && err.contains(&identify(&old.to_bytes().unwrap()).unwrap()),
            "{err}"
        );
        // Left as it was: the operator decides.
        assert_eq!(
            std::fs::read_to_string(sealed_dir.path().join("ca.pem")).unwrap(),
            other.cert_pem
        );
    }

    #[test]
    fn a_garbled_csr_is_refused() {
        assert!(NodeCa::check_csr("not a csr").is_err());
        assert!(NodeCa::check_csr(&csr("fine")).is_ok());
    }
}
