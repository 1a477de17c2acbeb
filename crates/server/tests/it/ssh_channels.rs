//! SSH channels against a real endpoint and a russh client: a connection that opens many
//! session channels gets the reservation's cap and no more (the endpoint stays up, and the
//! places come back once channels close), and forwarding to anything but the instance's own
//! loopback is refused.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpurent_server::ssh::{SessionCaps, SshLimits, SshServer};
use gpurent_store::Backend;
use reqwest::StatusCode;
use russh::keys::{load_secret_key, PrivateKeyWithHashAlg};
use serde_json::json;

use crate::app::{Tenant, TestApp};

pub struct Client;

impl russh::client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

fn keygen(dir: &Path) -> (russh::keys::PrivateKey, String) {
    let path = dir.join("id_ed25519");
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-N", "", "-t", "ed25519", "-f"])
        .arg(&path)
        .status()
        .expect("ssh-keygen (openssh-client; scripts/test.sh installs it)");
    assert!(status.success());
    let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
    (load_secret_key(&path, None).unwrap(), public)
}

/// A running reservation of tenant `ada` with her key, an SSH endpoint with these caps on the
/// app's state, and an SSH connection authenticated as that reservation.
pub struct SshRig {
    pub app: TestApp,
    pub ssh: SshServer,
    pub ada: Tenant,
    pub id: String,
    pub session: russh::client::Handle<Client>,
    _dir: tempfile::TempDir,
}

impl SshRig {
    pub async fn start(caps: SessionCaps) -> SshRig {
        let app = TestApp::with(Backend::Sqlite)
            .with_sim_gpus("1xRTX4090")
            .start()
            .await;
        let dir = tempfile::tempdir().unwrap();
        let state = app.server.as_ref().unwrap().state.clone();
        let limits = SshLimits {
            caps,
            ..SshLimits::default()
        };
        let ssh = SshServer::start("127.0.0.1:0".parse().unwrap(), dir.path(), state, limits)
            .await
            .unwrap();
        let (key, public) = keygen(dir.path());
        let ada = app.tenant("ada", "100").await;
        let (status, body) = ada
            .client
            .post("/api/v1/ssh-keys", &json!({"public_key": public}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let (status, r) = ada
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        let id = r["id"].as_str().unwrap().to_owned();
        app.wait_status(&ada.client, &id, "running").await;
        let config = Arc::new(russh::client::Config::default());
        let mut session = russh::client::connect(config, ssh.addr, Client)
            .await
            .unwrap();
        let auth = session
            .authenticate_publickey(&id, PrivateKeyWithHashAlg::new(Arc::new(key), None))
            .await
            .unwrap();
        assert!(auth.success(), "{auth:?}");
        SshRig {
            app,
            ssh,
            ada,
            id,
            session,
            _dir: dir,
        }
    }
}

#[tokio::test]
async fn channels_are_capped_per_reservation_and_forwards_stay_inside() {
    // Partial moves: the rest (the app, the key's directory) lives to the end of the test.
    let rig = SshRig::start(SessionCaps {
        sessions: 4,
        forwards: 2,
    })
    .await;
    let ssh = rig.ssh;
    let session = rig.session;

    // Many session channels at once: the cap's worth are opened, the rest refused.
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..50 {
        match session.channel_open_session().await {
            Ok(channel) => open.push(channel),
            Err(_) => refused += 1,
        }
    }
    assert_eq!((open.len(), refused), (4, 46));
    // Closing two gives two places back.
    for channel in open.drain(..2) {
        channel.close().await.unwrap();
    }
    let mut reopened = 0;
    for _ in 0..20 {
        if session.channel_open_session().await.is_ok() {
            reopened += 1;
            if reopened == 2 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(reopened, 2, "closed channels free their places");

    // Forwarding elsewhere than the instance itself is refused; to its own port the agent is
    // asked (the sim executor has nothing there: refused as a connect failure).
    for (host, port) in [("10.0.0.1", 80), ("example.com", 443), ("localhost", 0)] {
        let forwarded = session
            .channel_open_direct_tcpip(host, port, "127.0.0.1", 5555)
            .await;
        assert!(forwarded.is_err(), "{host}:{port} must be refused");
    }
    assert!(session
        .channel_open_direct_tcpip("localhost", 8000, "127.0.0.1", 5555)
        .await
        .is_err());

    // The endpoint took all that and still lets a new connection in.
    let again =
        russh::client::connect(Arc::new(russh::client::Config::default()), ssh.addr, Client).await;
    assert!(again.is_ok());
    ssh.shutdown().await;
}
