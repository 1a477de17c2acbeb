//! Webhooks through the CLI, with a real control plane (private receivers allowed) and a real
//! HTTP receiver on loopback: added with its secret shown once, a test delivered and its
//! signature checked, its attempt listed, removed; a bad event refused saying why.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::support::Cluster;

/// The (signature, body) of each POST a receiver got.
type Got = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A receiver answering 200 to every POST: its URL and what it got.
fn receiver() -> (String, Got) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let mut reader = BufReader::new(stream);
            let (mut length, mut signature) = (0usize, String::new());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                if lower.starts_with("x-gpurent-signature:") {
                    signature = line["x-gpurent-signature:".len()..].trim().to_owned();
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            seen.lock().unwrap().push((signature, body));
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (url, got)
}

#[test]
fn a_webhook_is_added_tested_and_removed_through_the_cli() {
    let cluster = Cluster::start_with("127.0.0.1:0", &["--notifications-allow-private"]);
    let rita = cluster.tenant("rita");
    let cli = |json: bool, args: &[&str]| cluster.cli(Some(&rita), json, args);
    let (url, got) = receiver();

    let bad = cli(
        false,
        &[
            "notifications",
            "add",
            &url,
            "--events",
            "budget_alert,nope",
        ],
    );
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("\"nope\" is not an event"), "{bad:?}");
    let added = cli(
        true,
        &["notifications", "add", &url, "--events", "budget_alert"],
    )
    .json();
    let (id, secret) = (
        added["id"].as_str().unwrap().to_owned(),
        added["secret"].as_str().unwrap().to_owned(),
    );
    let listed = cli(false, &["notifications", "ls"]);
    assert!(
        listed.stdout.contains(&id) && listed.stdout.contains("budget_alert"),
        "{listed:?}"
    );
    assert!(!listed.stdout.contains(&secret), "the secret is shown once");

    let tested = cli(false, &["notifications", "test", &id]);
    assert_eq!(tested.code, 0, "{tested:?}");
    assert!(
        tested.stdout.contains("delivered: answered 200"),
        "{tested:?}"
    );
    {
        let got = got.lock().unwrap();
        let (signature, body) = &got[0];
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        assert_eq!(
            *signature,
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        );
    }
    let deliveries = cli(false, &["notifications", "deliveries", &id]);
    assert!(
        deliveries.stdout.contains("test") && deliveries.stdout.contains("answered 200"),
        "{deliveries:?}"
    );
    assert_eq!(cli(false, &["notifications", "rm", &id]).code, 0);
    let gone = cli(false, &["notifications", "deliveries", &id]);
    assert_ne!(gone.code, 0, "{gone:?}");
}
