//! Owner-only files for secrets (private keys, tokens, a node's identity) and PEM loading, one
//! way for the agent and the control plane: a secret is 0600 from the moment it exists (never
//! readable by others, not even between its creation and a chmod) and replaced atomically, and
//! a PEM file that cannot be used says why.

use std::io::Write;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The mode of every secret this module writes: its owner's alone.
pub const OWNER_ONLY: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
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
    #[error("{path} is not valid PEM: {reason}")]
    BadPem { path: PathBuf, reason: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key")]
    NoKey { path: PathBuf },
}

/// Writes `bytes` to `path`, readable by its owner only, atomically: a temporary file beside
/// it (`PATH.tmp`, made anew so that no leftover lends it its mode), synced, then renamed over
/// `path`. A reader sees the old contents or the new, never half of them.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), KeyFileError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let fail = |source| KeyFileError::Write {
        path: path.to_owned(),
        source,
    };
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
        _ => {}
    }
    write_new(&tmp, bytes).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

/// Writes a new file readable by its owner only; one that exists already is never replaced
/// (the error's source is `AlreadyExists`).
pub fn create_private(path: &Path, bytes: &[u8]) -> Result<(), KeyFileError> {
    write_new(path, bytes).map_err(|source| KeyFileError::Write {
        path: path.to_owned(),
        source,
    })
}

fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, OWNER_ONLY);
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn read(path: &Path) -> Result<Vec<u8>, KeyFileError> {
    std::fs::read(path).map_err(|source| KeyFileError::Read {
        path: path.to_owned(),
        source,
    })
}

fn bad_pem(path: &Path, e: &pem::Error) -> KeyFileError {
    KeyFileError::BadPem {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// Every certificate of a PEM file, in its order (a chain: leaf first). Text outside the PEM
/// sections (a bundle's comments) is skipped; a broken section is an error that says how.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, KeyFileError> {
    let bytes = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem(path, &e))?;
    if certs.is_empty() {
        return Err(KeyFileError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, KeyFileError> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => KeyFileError::NoKey {
            path: path.to_owned(),
        },
        other => bad_pem(path, &other),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_written_secret_is_owner_only_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("node.key");
        write_private(&key, b"first").unwrap();
        assert_eq!(mode(&key), 0o600);
        // A leftover temporary file open to everyone lends the new file nothing.
        let tmp = dir.path().join("node.key.tmp");
        std::fs::write(&tmp, b"stale").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666)).unwrap();
        write_private(&key, b"second").unwrap();
        assert_eq!(mode(&key), 0o600);
        assert_eq!(std::fs::read(&key).unwrap(), b"second");
        assert!(!tmp.exists(), "the temporary file is renamed away");
    }

    #[test]
    fn a_created_secret_is_owner_only_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("admin.token");
        create_private(&token, b"gpr_1").unwrap();
        assert_eq!(mode(&token), 0o600);
        let again = create_private(&token, b"gpr_2").unwrap_err();
        match &again {
            KeyFileError::Write { path, source } => {
                assert_eq!(path, &token);
                assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read(&token).unwrap(), b"gpr_1");
    }

    /// A PEM section of this label around these bytes (PEM parsing decodes base64, it does
    /// not parse the DER: any bytes do).
    fn section(label: &str, der: &[u8]) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        format!("-----BEGIN {label}-----\n{b64}\n-----END {label}-----\n")
    }

    #[test]
    fn pem_files_load_or_say_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let cert = section("CERTIFICATE", b"leaf");
        // A bundle's comments around the sections are fine; the order is kept.
        let bundle = file(
            "bundle.pem",
            &format!(
                "# a CA bundle\n{cert}\n# end\n{}",
                section("CERTIFICATE", b"ca")
            ),
        );
        let certs = load_certs(&bundle).unwrap();
        assert_eq!(certs.len(), 2);
        assert_eq!(certs[0].as_ref(), b"leaf");
        let key = file(
            "tls.key",
            &format!("{cert}{}", section("PRIVATE KEY", b"secret")),
        );
        assert_eq!(load_private_key(&key).unwrap().secret_der(), b"secret");

        let garbage = file(
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\nthis is not base64!\n-----END CERTIFICATE-----\n",
        );
        let e = load_certs(&garbage).unwrap_err();
        assert!(matches!(e, KeyFileError::BadPem { .. }), "{e:?}");
        let message = e.to_string();
        assert!(
            message.contains("garbage.pem") && message.contains("base64"),
            "{message}"
        );

        let cut = file("cut.pem", &cert[..cert.len() - 10]);
        let message = load_certs(&cut).unwrap_err().to_string();
        assert!(message.contains("missing section end"), "{message}");

        let text = file("notes.txt", "no PEM here\n");
        let e = load_certs(&text).unwrap_err();
        assert!(matches!(e, KeyFileError::NoCertificate { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("{} holds no PEM certificate", text.display())
        );
        // A certificate is not a key.
        let e = load_private_key(&bundle).unwrap_err();
        assert!(matches!(e, KeyFileError::NoKey { .. }), "{e:?}");
        let e = load_private_key(&dir.path().join("missing.key")).unwrap_err();
        assert!(matches!(e, KeyFileError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains("missing.key"), "{e}");
    }
}
