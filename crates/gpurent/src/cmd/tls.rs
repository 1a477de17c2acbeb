//! TLS settings of `up` and `server`: the certificate files or the self-signed one, the node
//! CA (both shared by every replica through the database), and the refusal to serve plain
//! HTTP beyond loopback.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gpurent_server::tls::{self, NodeCa, TlsConfig};

use crate::cli::ServerTlsArgs;

/// What `--tls-*` asks for: `None` is plain HTTP, allowed on loopback (or when insecure HTTP
/// is allowed explicitly).
pub async fn server_tls(
    args: &ServerTlsArgs,
    data_dir: &Path,
    listen: SocketAddr,
    master_key: &dyn gpurent_server::secrets::KeyProvider,
    store: &gpurent_store::SqlStore,
) -> anyhow::Result<Option<TlsConfig>> {
    let (cert, key) = match (&args.tls_cert, &args.tls_key, args.tls_self_signed) {
        (Some(cert), Some(key), _) => {
            super::private::warn_if_open(key);
            (cert.clone(), key.clone())
        }
        (_, _, true) => {
            let made = tls::self_signed(
                store,
                master_key,
                data_dir,
                &names(listen),
                chrono::Utc::now(),
            )
            .await
            .context("cannot make the self-signed certificate")?;
            let verb = if made.created { "generated" } else { "reusing" };
            eprintln!(
                "gpurent: {verb} self-signed TLS certificate {}; SHA-256 fingerprint: {}",
                made.cert.display(),
                made.fingerprint
            );
            (made.cert, made.key)
        }
        _ => {
            if !listen.ip().is_loopback() && !args.allow_insecure_http {
                bail!(
                    "refusing to serve plain HTTP on {listen}, beyond loopback: give --tls-cert \
                     and --tls-key, or --tls-self-signed (or --allow-insecure-http to accept \
                     tokens in clear on the network)"
                );
            }
            return Ok(None);
        }
    };
    let node_ca = NodeCa::load_or_create(store, master_key, data_dir, chrono::Utc::now())
        .await
        .context("cannot open the node CA")?;
    Ok(Some(TlsConfig {
        cert,
        key,
        reload_every: Duration::from_secs(args.tls_reload_secs.max(1)),
        node_ca: Arc::new(node_ca),
    }))
}

/// The names a self-signed certificate is for: the listen address, loopback and the host name.
fn names(listen: SocketAddr) -> Vec<String> {
    let mut names = vec![
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
        "localhost".to_owned(),
    ];
    if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
        names.push(listen.ip().to_string());
    }
    let host = super::agent::host_name();
    if !host.is_empty() && !names.contains(&host) {
        names.push(host);
    }
    names
}
