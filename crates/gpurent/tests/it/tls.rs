//! Transport security with real processes: TLS 1.3 only, clients that pin the certificate or
//! trust a CA, a renewed certificate served without a restart, plain HTTP on loopback only,
//! and agents on mutual TLS, one of them cut off by `gpurent nodes revoke`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme};

use crate::support::{cli_with, eventually, Cluster, Daemon, BIN};

/// Accepts any server certificate (and checks the handshake signature): these tests look at
/// which certificate is served and which protocol versions are.
#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
    client_cert: Option<&Path>,
) -> ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)));
    match client_cert {
        None => builder.with_no_client_auth(),
        Some(dir) => {
            let pem = |name: &str| std::fs::read(dir.join(name)).unwrap();
            let certs = rustls_pemfile::certs(&mut pem("node.crt").as_slice())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls_pemfile::private_key(&mut pem("node.key").as_slice())
                .unwrap()
                .unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
    }
}

fn host_port(url: &str) -> &str {
    url.trim_start_matches("https://")
        .trim_start_matches("http://")
}

/// A TLS connection to `url`: the served certificate's SHA-256 and the stream, or why not.
fn connect(
    url: &str,
    config: ClientConfig,
) -> Result<(String, rustls::StreamOwned<ClientConnection, TcpStream>), String> {
    let mut tcp = TcpStream::connect(host_port(url)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    while tls.is_handshaking() {
        tls.complete_io(&mut tcp).map_err(|e| e.to_string())?;
    }
    let leaf = tls.peer_certificates().unwrap()[0].clone();
    Ok((
        gpurent_agent::tls::fingerprint(leaf.as_ref()),
        rustls::StreamOwned::new(tls, tcp),
    ))
}

pub(crate) fn served_fingerprint(url: &str) -> String {
    connect(url, client_config(&[&rustls::version::TLS13], None))
        .unwrap()
        .0
}

/// One HTTP/1.1 request over `stream`; the answer's status line and body.
fn request(
    stream: &mut impl ReadWrite,
    method: &str,
    path: &str,
    bearer: &str,
    body: &str,
) -> String {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {bearer}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    // The peer may close without close_notify; what arrived is the answer.
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_self_signed_control_plane_speaks_tls13_to_pinned_and_ca_trusting_clients() {
    let cluster = Cluster::start_tls("127.0.0.1:0");
    assert!(
        cluster.url.starts_with("https://127.0.0.1:"),
        "{}",
        cluster.url
    );
    let data = cluster.dir.path().join("data");
    let fingerprint = std::fs::read_to_string(data.join("tls.fingerprint"))
        .unwrap()
        .trim()
        .to_owned();
    let log = std::fs::read_to_string(cluster.dir.path().join("server.log")).unwrap();
    assert!(
        log.contains(&format!("SHA-256 fingerprint: {fingerprint}")),
        "{log}"
    );
    // The node CA's key and the audit key are in the database, sealed by the master key.
    for secret in ["tls.key", "ca.pem", "master.key"] {
        assert_eq!(mode(&data.join(secret)), 0o600, "{secret}");
    }
    assert_eq!(served_fingerprint(&cluster.url), fingerprint);

    // Pinned: works.
    let users = cluster.cli(Some(&cluster.admin), true, &["users", "ls"]);
    assert_eq!(users.code, 0, "{users:?}");
    // Another pin: refused, saying why.
    let wrong: String = fingerprint
        .chars()
        .map(|c| if c == '0' { '1' } else { '0' })
        .collect();
    let pin = ["--tls-fingerprint".to_owned(), wrong.clone()];
    let refused = cli_with(&cluster.url, &pin, Some(&cluster.admin), true, &["balance"]);
    assert_ne!(refused.code, 0);
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains(&format!("not the pinned {wrong}")) && message.contains(&fingerprint),
        "{message}"
    );
    // The certificate as a CA: works. No trust at all: refused.
    let ca = [
        "--ca-cert".to_owned(),
        data.join("tls.crt").display().to_string(),
    ];
    let balance = cli_with(&cluster.url, &ca, Some(&cluster.admin), true, &["balance"]);
    assert_eq!(balance.code, 0, "{balance:?}");
    let untrusted = cli_with(&cluster.url, &[], Some(&cluster.admin), true, &["balance"]);
    assert_ne!(untrusted.code, 0, "{untrusted:?}");

    // A client that speaks TLS 1.2 only: no handshake.
    let tls12 = connect(
        &cluster.url,
        client_config(&[&rustls::version::TLS12], None),
    );
    let Err(error) = tls12 else {
        panic!("a TLS 1.2 client must be refused")
    };
    assert!(
        error.to_lowercase().contains("version") || error.contains("Alert"),
        "{error}"
    );

    // Under TLS the console's cookies are `__Host-` prefixed (no other site, an app's
    // among them, can set or overwrite them), Secure, for the whole host only.
    let (_, mut stream) = connect(
        &cluster.url,
        client_config(&[&rustls::version::TLS13], None),
    )
    .unwrap();
    let login = request(&mut stream, "GET", "/login", "none", "");
    let set_cookie = login
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("the login form sets its cookie: {login}"));
    assert!(
        set_cookie.contains("__Host-gpurent_login=")
            && set_cookie.contains("; Path=/;")
            && set_cookie.contains("; Secure")
            && !set_cookie.contains("Domain"),
        "{set_cookie}"
    );

    // Plain HTTP to the TLS port: no HTTP answer.
    let mut plain = TcpStream::connect(host_port(&cluster.url)).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let answer = request(&mut plain, "GET", "/healthz", "none", "");
    assert!(!answer.starts_with("HTTP/"), "{answer}");
}

/// Starts `gpurent ARGS` that should refuse to start: its exit status and stderr.
fn refused_start(args: &[&str]) -> (bool, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            return (status.success(), stderr);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("gpurent {args:?} kept running");
}

#[test]
fn plain_http_is_served_on_loopback_only_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let (ok, stderr) = refused_start(&["server", "--listen", "0.0.0.0:0", "--data-dir", data]);
    assert!(!ok);
    assert!(stderr.contains("refusing to serve plain HTTP"), "{stderr}");
    assert!(stderr.contains("--tls-self-signed"), "{stderr}");
    let allowed = Daemon::start(
        &[
            "server",
            "--listen",
            "0.0.0.0:0",
            "--allow-insecure-http",
            "--data-dir",
            data,
        ],
        &dir.path().join("server.log"),
    );
    assert!(
        allowed.url.starts_with("http://127.0.0.1:"),
        "{}",
        allowed.url
    );
}

#[test]
fn agents_sync_on_mutual_tls_and_a_revoked_node_is_cut_off() {
    let cluster = Cluster::start_tls("127.0.0.1:0");
    let mut agents = Vec::new();
    for name in ["box-a", "box-b"] {
        let args = cluster.agent_args(name, &[]);
        agents.push(cluster.agent(name, &args));
    }
    cluster.wait_ready(2);
    let dirs = ["box-a", "box-b"].map(|n| cluster.dir.path().join(n));
    for dir in &dirs {
        // A node counts as ready from its registration, a moment before its agent has
        // written what the answer carried.
        eventually("the node's identity written", 10, || {
            dir.join("node.json").exists()
        });
        for file in ["node.key", "node.crt", "node.json"] {
            assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
        }
    }
    let node_token = |dir: &Path| {
        let identity: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("node.json")).unwrap()).unwrap();
        identity["node_token"].as_str().unwrap().to_owned()
    };
    let token_a = node_token(&dirs[0]);
    let sync = |cert: Option<&Path>| {
        let config = client_config(&[&rustls::version::TLS13], cert);
        let (_, mut stream) = connect(&cluster.url, config).unwrap();
        request(
            &mut stream,
            "POST",
            "/api/v1/agent/sync",
            &token_a,
            r#"{"gpus":[],"instances":[]}"#,
        )
    };
    // The node token alone, without the node's certificate: refused.
    let bare = sync(None);
    assert!(bare.starts_with("HTTP/1.1 403"), "{bare}");
    assert!(bare.contains("client certificate"), "{bare}");
    // Another node's certificate with this node's token: refused.
    let crossed = sync(Some(&dirs[1]));
    assert!(crossed.starts_with("HTTP/1.1 403"), "{crossed}");

    // Work on one node; revoke that node: it is cut off, lost, and its work runs elsewhere.
    let tenant = cluster.tenant("pat");
    let id = cluster.reserve(
        &tenant,
        &["--gpu", "rtx4090", "--hours", "1", "--", "sleep", "600"],
    );
    eventually("running", 30, || {
        cluster.get(&tenant, &id)["status"] == "running"
    });
    let first = cluster.get(&tenant, &id)["node"]
        .as_str()
        .unwrap()
        .to_owned();
    let victim = cluster
        .nodes()
        .iter()
        .find(|n| n["id"] == first.as_str() || n["name"] == first.as_str())
        .map(|n| n["name"].as_str().unwrap().to_owned())
        .unwrap();
    let revoked = cluster.cli(Some(&cluster.admin), true, &["nodes", "revoke", &victim]);
    assert_eq!(revoked.code, 0, "{revoked:?}");
    assert_eq!(revoked.json()["revoked"], true);
    eventually("the revoked node lost", 30, || {
        cluster.node_status(&victim).as_deref() == Some("lost")
    });
    eventually("the work running on the other node", 30, || {
        let r = cluster.get(&tenant, &id);
        r["status"] == "running" && r["node"].as_str() != Some(first.as_str())
    });
    let agent_log =
        std::fs::read_to_string(cluster.dir.path().join(format!("{victim}.log"))).unwrap();
    assert!(agent_log.contains("certificate is revoked"), "{agent_log}");
    // Still lost a while later: its agent keeps trying and keeps being refused.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(cluster.node_status(&victim).as_deref(), Some("lost"));
    drop(agents);
}

#[test]
fn up_with_tls_runs_its_local_agent_on_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = Daemon::start(
        &[
            "up",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--tls-self-signed",
            "--sim-gpus",
            "1xRTX4090",
            "--executor",
            "sim",
        ],
        &dir.path().join("up.log"),
    );
    assert!(up.url.starts_with("https://127.0.0.1:"), "{}", up.url);
    let fingerprint = std::fs::read_to_string(data.join("tls.fingerprint")).unwrap();
    let pin = [
        "--tls-fingerprint".to_owned(),
        fingerprint.trim().to_owned(),
    ];
    let admin = crate::support::read_token(&data);
    let nodes = cli_with(&up.url, &pin, Some(&admin), true, &["nodes", "ls"]).json();
    assert_eq!(nodes[0]["status"], "ready", "{nodes}");
    eventually("the local agent's certificate", 10, || {
        data.join("agent/node.crt").exists()
    });
    let status = up.terminate();
    assert!(status.success(), "{status:?}");
}

/// True when the server closes `stream` (EOF or reset) within `bound`.
fn closed_within(stream: &mut impl Read, bound: Duration) -> bool {
    let started = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    while started.elapsed() < bound {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn tls_clients_slow_to_handshake_or_to_send_a_header_are_closed() {
    let mut cluster = Cluster::start_with(
        "127.0.0.1:0",
        &["--tls-self-signed", "--header-timeout-secs", "1"],
    );
    let fingerprint =
        std::fs::read_to_string(cluster.dir.path().join("data/tls.fingerprint")).unwrap();
    cluster.tls = vec!["--tls-fingerprint".into(), fingerprint.trim().to_owned()];
    let bound = Duration::from_secs(30);
    let addr = host_port(&cluster.url);
    // Connected, no handshake; and half a ClientHello record.
    let mut silent = TcpStream::connect(addr).unwrap();
    let mut half_hello = TcpStream::connect(addr).unwrap();
    half_hello
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .unwrap();
    // Handshaken, then half a request header.
    let (_, mut half_header) = connect(
        &cluster.url,
        client_config(&[&rustls::version::TLS13], None),
    )
    .unwrap();
    half_header
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    half_header.flush().unwrap();
    for s in [&silent, &half_hello] {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
    }
    half_header
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // A real client is served meanwhile.
    let users = cluster.cli(Some(&cluster.admin), true, &["users", "ls"]);
    assert_eq!(users.code, 0, "{users:?}");
    assert!(
        closed_within(&mut silent, bound),
        "no handshake: still open"
    );
    assert!(
        closed_within(&mut half_hello, bound),
        "half a ClientHello: still open"
    );
    assert!(
        closed_within(&mut half_header, bound),
        "half a header over TLS: still open"
    );
}
