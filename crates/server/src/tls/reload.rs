//! The served certificate, swapped in place when its files change (polled), so a renewed
//! certificate takes effect on the next connection without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use super::{fingerprint, load_certified_key, TlsError};

/// Serves the current certificate; [`ReloadingResolver::watch`] replaces it.
#[derive(Debug)]
pub struct ReloadingResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingResolver {
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        Ok(Arc::new(ReloadingResolver {
            current: RwLock::new(load_certified_key(cert, key)?),
        }))
    }

    /// The SHA-256 of the certificate served now.
    pub fn fingerprint(&self) -> String {
        let current = self.current();
        current
            .cert
            .first()
            .map(|c| fingerprint(c.as_ref()))
            .unwrap_or_default()
    }

    fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn replace(&self, new: Arc<CertifiedKey>) {
        match self.current.write() {
            Ok(mut guard) => *guard = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }

    /// Reads the pair again now (SIGHUP): the new certificate's fingerprint once it serves,
    /// or why it does not (the old one stays).
    pub fn reload(&self, cert: &Path, key: &Path) -> Result<String, TlsError> {
        let new = load_certified_key(cert, key)?;
        self.replace(new);
        Ok(self.fingerprint())
    }

    /// Polls the files every `every` until `stopped`: a changed pair that loads replaces the
    /// certificate; one that does not is logged and the old certificate stays.
    pub async fn watch(
        self: Arc<Self>,
        cert: PathBuf,
        key: PathBuf,
        every: Duration,
        mut stopped: watch::Receiver<bool>,
    ) {
        let mut seen = (stamp(&cert), stamp(&key));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
            let now = (stamp(&cert), stamp(&key));
            if now == seen {
                continue;
            }
            seen = now;
            match load_certified_key(&cert, &key) {
                Ok(new) => {
                    self.replace(new);
                    tracing::info!(cert = %cert.display(), fingerprint = %self.fingerprint(), "TLS certificate reloaded");
                }
                Err(e) => {
                    tracing::error!(cert = %cert.display(), error = %error_chain(&e), "new TLS certificate not usable; keeping the old one");
                }
            }
        }
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// What tells a file changed: its modification time and length.
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
