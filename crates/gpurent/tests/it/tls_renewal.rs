//! A renewed certificate served without a restart: when its files change (polled), and at
//! once on SIGHUP; a pair that does not load leaves the served one.

use std::path::{Path, PathBuf};

use crate::support::{cli_with, eventually, Daemon};
use crate::tls::served_fingerprint;

/// A self-signed certificate in `dir`, from a database of its own (one database would give
/// every call the same).
fn self_signed(dir: &Path, names: &[String]) -> gpurent_server::tls::SelfSigned {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let db = gpurent_store::testing::TestDatabase::new(gpurent_store::Backend::Sqlite)
            .await
            .unwrap();
        let store = gpurent_store::SqlStore::connect(&db.url).await.unwrap();
        let master = gpurent_server::secrets::LocalKey::from_bytes(&[1; 32]);
        let made =
            gpurent_server::tls::self_signed(&store, &master, dir, names, chrono::Utc::now())
                .await
                .unwrap();
        store.close().await;
        made
    })
}

fn copy_pair(from: &Path, cert: &Path, key: &Path) {
    std::fs::copy(from.join("tls.key"), key).unwrap();
    std::fs::copy(from.join("tls.crt"), cert).unwrap();
}

#[test]
fn a_renewed_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["127.0.0.1".to_owned()];
    let [old, new]: [PathBuf; 2] = ["old", "new"].map(|n| dir.path().join(n));
    let [first, second] = [&old, &new].map(|dir| self_signed(dir, &names));
    assert_ne!(first.fingerprint, second.fingerprint);
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    copy_pair(&old, &cert, &key);
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let server = Daemon::start(
        &[
            "server",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-reload-secs",
            "1",
        ],
        &log,
    );
    assert_eq!(served_fingerprint(&server.url), first.fingerprint);

    // A broken file: logged, and the old certificate stays.
    std::fs::write(&cert, "not a certificate").unwrap();
    eventually("the broken certificate logged", 10, || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("keeping the old one")
    });
    assert_eq!(served_fingerprint(&server.url), first.fingerprint);

    // The renewed pair: the next connection gets it, from the same process.
    copy_pair(&new, &cert, &key);
    eventually("the renewed certificate served", 10, || {
        served_fingerprint(&server.url) == second.fingerprint
    });
    let users = cli_with(
        &server.url,
        &["--tls-fingerprint".to_owned(), second.fingerprint.clone()],
        Some(&crate::support::read_token(&data)),
        true,
        &["users", "ls"],
    );
    assert_eq!(users.code, 0, "{users:?}");
}

/// SIGHUP reads the certificate's files at once (the poll here is an hour apart); a pair that
/// does not load is said in the log and the served one stays.
#[test]
fn sighup_serves_a_renewed_certificate_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["127.0.0.1".to_owned()];
    let [old, new]: [PathBuf; 2] = ["old", "new"].map(|n| dir.path().join(n));
    let [first, second] = [&old, &new].map(|dir| self_signed(dir, &names));
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    copy_pair(&old, &cert, &key);
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let server = Daemon::start(
        &[
            "server",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-reload-secs",
            "3600",
        ],
        &log,
    );
    assert_eq!(served_fingerprint(&server.url), first.fingerprint);
    let hup = || {
        let pid = server.child.id().to_string();
        assert!(std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
    };
    copy_pair(&new, &cert, &key);
    hup();
    let renewed = format!("TLS certificate {}", second.fingerprint);
    eventually("the reload logged", 30, || {
        std::fs::read_to_string(&log).unwrap().contains(&renewed)
    });
    assert_eq!(served_fingerprint(&server.url), second.fingerprint);

    std::fs::write(&cert, "not a certificate").unwrap();
    hup();
    eventually("the broken pair logged", 30, || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("the TLS certificate's files did not load, the old one stays")
    });
    assert_eq!(served_fingerprint(&server.url), second.fingerprint);
}
