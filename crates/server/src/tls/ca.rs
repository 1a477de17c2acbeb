//! The control plane's own CA (`ca.pem`, and its key sealed by the master key in
//! `ca.key.sealed`, both in the data dir, mode 0600): it signs each node's certificate from the
//! node's CSR at registration, so a node's key never leaves it.

use std::path::Path;

use chrono::{DateTime, Datelike, Utc};
use rustls::pki_types::CertificateDer;

use gpurent_types::keyfile::{load_certs, write_private};

use super::files::fingerprint;
use crate::secrets::{open_bytes, seal_bytes, KeyProvider};

/// Bound to the sealed CA key.
const CA_KEY_PURPOSE: &[u8] = b"gpurent-node-ca-key-v1";
use super::TlsError;

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

impl NodeCa {
    /// Loads the CA from `dir`, or creates it there on first start; its key is kept sealed by
    /// the master key (a plain `ca.key` from an older version is sealed, then removed).
    pub fn load_or_create(dir: &Path, master: &dyn KeyProvider) -> Result<NodeCa, TlsError> {
        let cert_path = dir.join("ca.pem");
        let sealed_path = dir.join("ca.key.sealed");
        let plain_path = dir.join("ca.key");
        let seal = |pem: &str| -> Result<(), TlsError> {
            let sealed = seal_bytes(master, pem.as_bytes(), CA_KEY_PURPOSE)
                .map_err(|e| TlsError::Sealed(e.to_string()))?;
            write_private(&sealed_path, sealed.as_bytes()).map_err(TlsError::from)
        };
        if cert_path.exists() && plain_path.exists() && !sealed_path.exists() {
            let pem = std::fs::read_to_string(&plain_path).map_err(|source| TlsError::Read {
                path: plain_path.clone(),
                source,
            })?;
            seal(&pem)?;
            std::fs::remove_file(&plain_path).map_err(|source| TlsError::Read {
                path: plain_path.clone(),
                source,
            })?;
        }
        if !(cert_path.exists() && sealed_path.exists()) {
            let key = rcgen::KeyPair::generate().map_err(TlsError::Generate)?;
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
            let cert = params.self_signed(&key).map_err(TlsError::Generate)?;
            seal(&key.serialize_pem())?;
            write_private(&cert_path, cert.pem().as_bytes())?;
        }
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let cert_pem = read(&cert_path)?;
        let key_pem = open_bytes(master, &read(&sealed_path)?, CA_KEY_PURPOSE)
            .map_err(|e| TlsError::Sealed(e.to_string()))?;
        let key_pem = String::from_utf8(key_pem)
            .map_err(|_| TlsError::Sealed("the CA key is not PEM".to_owned()))?;
        let key = rcgen::KeyPair::from_pem(&key_pem).map_err(TlsError::Generate)?;
        let cert_der = load_certs(&cert_path)?.remove(0);
        // rcgen signs with an issuer built from the CA's parameters and key; the DER that
        // agents trust is the file's.
        let issuer = rcgen::CertificateParams::from_ca_cert_pem(&cert_pem)
            .and_then(|params| params.self_signed(&key))
            .map_err(TlsError::Generate)?;
        Ok(NodeCa {
            cert_pem,
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

    use super::*;

    fn csr(name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[test]
    fn a_node_certificate_chains_to_the_ca_and_names_the_node_only() {
        let dir = tempfile::tempdir().unwrap();
        let master = crate::secrets::LocalKey::from_bytes(&[5; 32]);
        let ca = NodeCa::load_or_create(dir.path(), &master).unwrap();
        // The same CA on the next start; its key only sealed on disk.
        let again = NodeCa::load_or_create(dir.path(), &master).unwrap();
        assert_eq!(ca.cert_der(), again.cert_der());
        assert!(!dir.path().join("ca.key").exists());
        let sealed = std::fs::read_to_string(dir.path().join("ca.key.sealed")).unwrap();
        assert!(!sealed.contains("PRIVATE KEY"));
        // Another master key cannot open it.
        let other_master = crate::secrets::LocalKey::from_bytes(&[6; 32]);
        assert!(NodeCa::load_or_create(dir.path(), &other_master).is_err());

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
        let other = tempfile::tempdir().unwrap();
        let stranger = NodeCa::load_or_create(other.path(), &master)
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

    #[test]
    fn a_garbled_csr_is_refused() {
        assert!(NodeCa::check_csr("not a csr").is_err());
        assert!(NodeCa::check_csr(&csr("fine")).is_ok());
    }
}
