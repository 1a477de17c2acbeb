//! gpurent's own SSH client (russh), for `cp` and `port-forward` without an ssh binary: it
//! connects only to a server with the pinned host key, logs in with the user's key (`-i`,
//! else ssh-agent, else ~/.ssh/id_*), and opens SFTP sessions and direct-tcpip channels.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use russh::client::{self, AuthResult, DisconnectReason, Handle};
use russh::keys::agent::client::AgentClient;
use russh::keys::ssh_key::{HashAlg, PrivateKey, PublicKey};
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyBase64, PublicKeyOrCertificate};
use russh::Channel;
use russh_sftp::client::SftpSession;

use crate::api_client::CliError;

/// How long connecting, the key exchange and logging in may take together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where to connect, as whom, and the host key the server must have.
#[derive(Debug, Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub host_key: PublicKey,
}

impl Target {
    fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SshClientError {
    #[error("cannot connect to the SSH endpoint {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the SSH endpoint {addr} did not answer within {CONNECT_TIMEOUT:?}")]
    Timeout { addr: String },
    #[error(
        "the SSH server at {addr} has host key {offered}, not the control plane's {expected}: \
         refusing to connect (another server at that address, or someone in between)"
    )]
    HostKeyMismatch {
        addr: String,
        offered: String,
        expected: String,
    },
    #[error("{0}")]
    Key(String),
    #[error("the SSH endpoint {addr} refused every key tried as {user} ({tried}){skipped}: add yours with `gpurent keys add ~/.ssh/id_ed25519.pub`, or give it with -i FILE")]
    AuthFailed {
        addr: String,
        user: String,
        tried: String,
        skipped: String,
    },
    #[error("the SSH endpoint closed the connection: {0}")]
    Disconnected(String),
    #[error(
        "the instance of reservation {user} did not start SFTP ({cause}): is it running, on an \
         executor that can be entered (not sim)?"
    )]
    NoSftp { user: String, cause: String },
    #[error("SSH: {0}")]
    Protocol(#[from] russh::Error),
    #[error("SFTP: {0}")]
    Sftp(#[from] russh_sftp::client::error::Error),
}

impl From<SshClientError> for CliError {
    fn from(e: SshClientError) -> Self {
        let code = match &e {
            SshClientError::HostKeyMismatch { .. } => "host_key_mismatch",
            SshClientError::AuthFailed { .. } | SshClientError::Key(_) => "ssh_auth_failed",
            SshClientError::Connect { .. } | SshClientError::Timeout { .. } => "ssh_unreachable",
            _ => "ssh_failed",
        };
        CliError::new(code, e.to_string())
    }
}

/// What the connection's event handler learnt that its caller needs for a clear message.
#[derive(Debug, Default)]
struct Seen {
    /// A host key other than the pinned one.
    offered: OnceLock<PublicKey>,
    /// The message of the server's disconnect.
    disconnect: OnceLock<String>,
}

/// Accepts exactly the pinned host key.
struct Pinned {
    expected: PublicKey,
    seen: Arc<Seen>,
}

impl client::Handler for Pinned {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        offered: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match offered {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            // A certificate is not the pinned key, even one for it.
            PublicKeyOrCertificate::Certificate(cert) => {
                PublicKey::new(cert.public_key().clone(), "")
            }
        };
        let pinned = matches!(offered, PublicKeyOrCertificate::PublicKey { .. })
            && key.key_data() == self.expected.key_data();
        if !pinned {
            let _ = self.seen.offered.set(key);
        }
        Ok(pinned)
    }

    async fn disconnected(
        &mut self,
        reason: DisconnectReason<Self::Error>,
    ) -> Result<(), Self::Error> {
        match reason {
            DisconnectReason::ReceivedDisconnect(info) => {
                let _ = self.seen.disconnect.set(info.message);
                Ok(())
            }
            DisconnectReason::Error(e) => Err(e),
        }
    }
}

/// A logged-in SSH connection.
pub struct Connection {
    handle: Handle<Pinned>,
    seen: Arc<Seen>,
    target: Target,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Connects to `target`, checks its host key and logs in (`identity`, else the agent's keys,
/// else ~/.ssh/id_ed25519, id_ecdsa, id_rsa).
pub async fn connect(
    target: &Target,
    identity: Option<&Path>,
) -> Result<Connection, SshClientError> {
    let addr = target.addr();
    match tokio::time::timeout(CONNECT_TIMEOUT, connect_inner(target, identity)).await {
        Ok(result) => result,
        Err(_) => Err(SshClientError::Timeout { addr }),
    }
}

async fn connect_inner(
    target: &Target,
    identity: Option<&Path>,
) -> Result<Connection, SshClientError> {
    let addr = target.addr();
    let stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|source| SshClientError::Connect {
            addr: addr.clone(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    let config = Arc::new(client::Config {
        // Bulk copies: a larger window than the default keeps a fast link busy.
        window_size: 8 * 1024 * 1024,
        keepalive_interval: Some(Duration::from_secs(30)),
        nodelay: true,
        ..client::Config::default()
    });
    let seen = Arc::new(Seen::default());
    let handler = Pinned {
        expected: target.host_key.clone(),
        seen: seen.clone(),
    };
    let mut handle = match client::connect_stream(config, stream, handler).await {
        Ok(handle) => handle,
        Err(e) => {
            if let Some(offered) = seen.offered.get() {
                return Err(SshClientError::HostKeyMismatch {
                    addr,
                    offered: fingerprint(offered),
                    expected: fingerprint(&target.host_key),
                });
            }
            return Err(e.into());
        }
    };
    authenticate(&mut handle, target, identity)
        .await
        // A refusal after the login (a stopped reservation) comes as a disconnect.
        .map_err(|e| match seen.disconnect.get() {
            Some(message) => SshClientError::Disconnected(message.clone()),
            None => e,
        })?;
    Ok(Connection {
        handle,
        seen,
        target: target.clone(),
    })
}

/// A private key file: its key, or the public half of one that needs a passphrase.
enum LoadedKey {
    Plain(Box<PrivateKey>),
    Encrypted(Option<PublicKey>),
}

fn load_key(path: &Path) -> Result<LoadedKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the key {}: {e}", path.display()))?;
    match russh::keys::decode_secret_key(&text, None) {
        Ok(key) => Ok(LoadedKey::Plain(Box::new(key))),
        Err(russh::keys::Error::KeyIsEncrypted) => {
            // OpenSSH keeps the public half in clear; other formats have it in FILE.pub.
            let public = PrivateKey::from_openssh(&text)
                .ok()
                .map(|k| k.public_key().clone())
                .or_else(|| {
                    let mut pub_path = path.as_os_str().to_owned();
                    pub_path.push(".pub");
                    russh::keys::load_public_key(PathBuf::from(pub_path)).ok()
                });
            Ok(LoadedKey::Encrypted(public))
        }
        Err(e) => Err(format!(
            "{} is not a private key gpurent can read: {e}",
            path.display()
        )),
    }
}

async fn agent() -> Option<AgentClient<tokio::net::UnixStream>> {
    let sock = std::env::var_os("SSH_AUTH_SOCK")?;
    AgentClient::connect_uds(sock).await.ok()
}

async fn try_key(
    handle: &mut Handle<Pinned>,
    user: &str,
    key: PrivateKey,
    rsa_hash: Option<HashAlg>,
) -> Result<bool, SshClientError> {
    let hash = key.algorithm().is_rsa().then_some(rsa_hash).flatten();
    let result = handle
        .authenticate_publickey(user, PrivateKeyWithHashAlg::new(Arc::new(key), hash))
        .await?;
    Ok(matches!(result, AuthResult::Success))
}

async fn try_agent_key(
    handle: &mut Handle<Pinned>,
    agent: &mut AgentClient<tokio::net::UnixStream>,
    user: &str,
    key: PublicKey,
    rsa_hash: Option<HashAlg>,
) -> bool {
    let hash = key.algorithm().is_rsa().then_some(rsa_hash).flatten();
    // An agent that declines to sign is one key fewer, not the end.
    matches!(
        handle
            .authenticate_publickey_with(user, key, hash, agent)
            .await,
        Ok(AuthResult::Success)
    )
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

async fn authenticate(
    handle: &mut Handle<Pinned>,
    target: &Target,
    identity: Option<&Path>,
) -> Result<(), SshClientError> {
    let user = target.user.as_str();
    let rsa_hash = handle.best_supported_rsa_hash().await?.flatten();
    let mut tried: Vec<String> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let failed = |tried: Vec<String>, skipped: Vec<String>| SshClientError::AuthFailed {
        addr: target.addr(),
        user: user.to_owned(),
        tried: if tried.is_empty() {
            "none found".to_owned()
        } else {
            tried.join(", ")
        },
        skipped: if skipped.is_empty() {
            String::new()
        } else {
            format!("; not used: {}", skipped.join(", "))
        },
    };
    if let Some(path) = identity {
        match load_key(path).map_err(SshClientError::Key)? {
            LoadedKey::Plain(key) => {
                if try_key(handle, user, *key, rsa_hash).await? {
                    return Ok(());
                }
            }
            LoadedKey::Encrypted(public) => {
                let held = match (agent().await, public) {
                    (Some(mut agent), Some(public)) => {
                        let ids = agent.request_identities().await.unwrap_or_default();
                        let held = ids
                            .iter()
                            .any(|id| id.public_key().key_data() == public.key_data());
                        if held && try_agent_key(handle, &mut agent, user, public, rsa_hash).await {
                            return Ok(());
                        }
                        held
                    }
                    _ => false,
                };
                if !held {
                    return Err(SshClientError::Key(format!(
                        "{} needs a passphrase and no ssh-agent holds it: run `ssh-add {}` \
                         (with SSH_AUTH_SOCK set) and try again",
                        path.display(),
                        path.display()
                    )));
                }
            }
        }
        tried.push(path.display().to_string());
        return Err(failed(tried, skipped));
    }
    let mut offered = std::collections::HashSet::new();
    if let Some(mut agent) = agent().await {
        for id in agent.request_identities().await.unwrap_or_default() {
            let key = id.public_key().into_owned();
            offered.insert(key.public_key_base64());
            let label = format!("agent key {}", fingerprint(&key));
            if try_agent_key(handle, &mut agent, user, key, rsa_hash).await {
                return Ok(());
            }
            tried.push(label);
        }
    }
    if let Some(home) = home() {
        for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
            let path = home.join(".ssh").join(name);
            if !path.exists() {
                continue;
            }
            match load_key(&path) {
                Ok(LoadedKey::Plain(key)) => {
                    // The agent may have offered this one already: once is enough.
                    if offered.contains(&key.public_key().public_key_base64()) {
                        continue;
                    }
                    if try_key(handle, user, *key, rsa_hash).await? {
                        return Ok(());
                    }
                    tried.push(path.display().to_string());
                }
                Ok(LoadedKey::Encrypted(_)) => skipped.push(format!(
                    "{} (needs a passphrase: add it to ssh-agent with ssh-add)",
                    path.display()
                )),
                Err(e) => skipped.push(e),
            }
        }
    }
    Err(failed(tried, skipped))
}

impl Connection {
    /// Why the connection ended, if the server said.
    fn closed(&self, e: russh::Error) -> SshClientError {
        match self.seen.disconnect.get() {
            Some(message) => SshClientError::Disconnected(message.clone()),
            None => e.into(),
        }
    }

    /// An SFTP session on a new channel.
    pub async fn sftp(&self) -> Result<SftpSession, SshClientError> {
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| self.closed(e))?;
        channel
            .request_subsystem(true, "sftp")
            .await
            .map_err(|e| self.closed(e))?;
        SftpSession::new_with_config(channel.into_stream(), super::cp::sftp_config())
            .await
            .map_err(|e| SshClientError::NoSftp {
                user: self.target.user.clone(),
                cause: e.to_string(),
            })
    }

    /// A channel to `port` on 127.0.0.1 inside the instance, for a client at `from`.
    pub async fn direct_tcpip(
        &self,
        port: u16,
        from: std::net::SocketAddr,
    ) -> Result<Channel<client::Msg>, SshClientError> {
        self.handle
            .channel_open_direct_tcpip(
                "127.0.0.1",
                u32::from(port),
                from.ip().to_string(),
                u32::from(from.port()),
            )
            .await
            .map_err(|e| self.closed(e))
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Says goodbye to the server.
    pub async fn close(self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "")
            .await;
    }
}
