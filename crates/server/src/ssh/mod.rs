//! The control plane's SSH endpoint (`--ssh-listen`): OpenSSH clients connect as a
//! reservation id with one of its owner's keys, and each channel is relayed to the instance
//! through its node's tunnel.

mod auth;
mod endpoint;
mod handler;
mod host_key;
mod relay;
mod sessions;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use russh::keys::ssh_key::PublicKey;
use russh::server::Config;
use russh::{Disconnect, MethodKind, MethodSet};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub use auth::Decision;
pub use endpoint::{host_of, valid_host, Advertise, SshEndpoint, SshEndpointInfo};
pub use host_key::{HostKeyError, HOST_KEY_FILE};
pub use sessions::{SessionCaps, Sessions, Slot};

pub(crate) use auth::not_running;
pub(crate) use relay::{Counts, RelayContext, Via};

use crate::serve::caps::Caps;
use crate::state::AppState;

/// Limits of the SSH endpoint; the defaults suit production.
#[derive(Debug, Clone, Copy)]
pub struct SshLimits {
    /// A connection that has not authenticated by then is disconnected.
    pub auth_timeout: Duration,
    /// Public-key attempts per connection (a client with many keys in its agent offers them
    /// one by one; OpenSSH's own server allows 6).
    pub max_auth_attempts: usize,
    /// Open connections from one client address (an IPv6 /64 counts as one).
    pub max_connections_per_ip: usize,
    /// Open connections in all.
    pub max_connections: usize,
    /// A connection with no traffic this long is closed.
    pub inactivity_timeout: Duration,
    /// How often an open connection checks that its key is still the owner's and the
    /// reservation still runs (a removed key or an ended reservation disconnects it).
    pub recheck: Duration,
    /// Channels per reservation.
    pub caps: SessionCaps,
}

impl Default for SshLimits {
    fn default() -> Self {
        SshLimits {
            auth_timeout: Duration::from_secs(30),
            max_auth_attempts: 6,
            max_connections_per_ip: 32,
            max_connections: 1024,
            inactivity_timeout: Duration::from_secs(15 * 60),
            recheck: Duration::from_secs(5),
            caps: SessionCaps::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("cannot listen for SSH on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    HostKey(#[from] HostKeyError),
}

/// The SSH endpoint, serving until [`SshServer::shutdown`].
#[derive(Debug)]
pub struct SshServer {
    pub addr: SocketAddr,
    /// The host key's public half, as clients see it.
    pub host_key: PublicKey,
    /// The channels open through this endpoint.
    pub sessions: Arc<Sessions>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl SshServer {
    /// Loads (or makes) the host key every replica shares (`host_key`) and listens on `listen`
    /// (port 0: a free one, in `addr`).
    pub async fn start(
        listen: SocketAddr,
        data_dir: &Path,
        state: AppState,
        limits: SshLimits,
    ) -> Result<SshServer, SshError> {
        let key = host_key::load_or_create(
            &*state.store,
            &*state.config.master_key,
            data_dir,
            state.clock.now(),
        )
        .await?;
        let host_key = key.public_key().clone();
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| SshError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SshError::Bind {
            addr: listen,
            source,
        })?;
        let config = Arc::new(Config {
            server_id: russh::SshId::Standard(
                concat!("SSH-2.0-gpurent_", env!("CARGO_PKG_VERSION")).into(),
            ),
            methods: MethodSet::from(&[MethodKind::PublicKey][..]),
            keys: vec![key],
            max_auth_attempts: limits.max_auth_attempts,
            // OpenSSH asks with "none" first to learn the methods: no need to make it wait.
            auth_rejection_time_initial: Some(Duration::ZERO),
            inactivity_timeout: Some(limits.inactivity_timeout),
            nodelay: true,
            ..Config::default()
        });
        let caps = Caps::new(
            limits.max_connections,
            Some(limits.max_connections_per_ip),
            // The HTTP listener's connection metrics are its own; SSH sessions get theirs with
            // the audit and metrics of sessions (issue 15, item 6).
            Arc::default(),
        );
        let (stop, stopped) = watch::channel(false);
        // One table with the web console's terminals: a reservation's cap holds across both.
        state.sessions.set_caps(limits.caps);
        let sessions = state.sessions.clone();
        let shared = Shared {
            config,
            state,
            sessions: sessions.clone(),
            limits,
        };
        let task = tokio::spawn(accept_loop(listener, shared, caps, stopped));
        tracing::info!(%addr, fingerprint = %host_key.fingerprint(Default::default()), "SSH endpoint listening");
        Ok(SshServer {
            addr,
            host_key,
            sessions,
            stop,
            task,
        })
    }

    /// What the API tells clients about this endpoint (`AppState::ssh_endpoint`).
    pub fn endpoint(&self, advertise: Option<Advertise>) -> SshEndpoint {
        SshEndpoint {
            addr: self.addr,
            host_key: self.host_key.clone(),
            advertise,
        }
    }

    /// Stops accepting connections; open ones are dropped with the runtime.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// What every connection of the endpoint shares.
#[derive(Debug, Clone)]
struct Shared {
    config: Arc<Config>,
    state: AppState,
    sessions: Arc<Sessions>,
    limits: SshLimits,
}

async fn accept_loop(
    listener: TcpListener,
    shared: Shared,
    caps: Arc<Caps>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "ssh: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let permit = match caps.admit(peer.ip()) {
            Ok(permit) => permit,
            Err(refusal) => {
                tracing::info!(%peer, reason = %refusal.message(), "ssh: connection refused");
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(stream, peer, shared.clone(), permit));
    }
}

/// One connection: until it authenticates it has `auth_timeout` (the SSH id exchange, key
/// exchange and auth together), then as long as it is active.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: Shared,
    _permit: crate::serve::caps::Permit,
) {
    let Shared {
        config,
        state,
        sessions,
        limits,
    } = shared;
    let store = state.store.clone();
    let deadline = tokio::time::Instant::now() + limits.auth_timeout;
    let (authenticated, mut authenticated_rx) = oneshot::channel();
    let handler = handler::Connection::new(state, sessions, Some(peer), authenticated);
    let mut session =
        match tokio::time::timeout_at(deadline, russh::server::run_stream(config, stream, handler))
            .await
        {
            Ok(Ok(session)) => session,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "ssh: handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "ssh: no SSH id before the auth timeout");
                return;
            }
        };
    let handle = session.handle();
    let entered = tokio::select! {
        ended = &mut session => {
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "ssh: connection ended before auth");
            }
            return;
        }
        entered = &mut authenticated_rx => match entered {
            Ok(entered) => entered,
            // Authenticated only to be told why not (a reservation that does not run): the
            // handler disconnects it.
            Err(_) => {
                let _ = session.await;
                return;
            }
        },
        _ = tokio::time::sleep_until(deadline) => {
            tracing::info!(%peer, "ssh: not authenticated in time, disconnecting");
            let _ = handle
                .disconnect(
                    Disconnect::ByApplication,
                    format!("not authenticated within {:?}", limits.auth_timeout),
                    String::new(),
                )
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut session).await;
            return;
        }
    };
    // While it is open, the key must stay the owner's and the reservation must run.
    let mut recheck = tokio::time::interval(limits.recheck);
    recheck.tick().await;
    loop {
        tokio::select! {
            ended = &mut session => {
                if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "ssh: connection ended");
                }
                break;
            }
            _ = recheck.tick() => {
                let why = match auth::decide(&*store, &entered.user, &entered.key).await {
                    Decision::Enter { .. } => continue,
                    Decision::NotRunning { message } => message,
                    Decision::Refuse => format!(
                        "the {} is no longer one of the keys that may enter reservation {} \
                         (its owner's, or for a team's, those of its members)",
                        entered.ctx.via, entered.user
                    ),
                };
                tracing::info!(%peer, user = %entered.user, %why, "ssh: disconnecting");
                let _ = handle.disconnect(Disconnect::ByApplication, why, String::new()).await;
                let _ = tokio::time::timeout(Duration::from_secs(5), &mut session).await;
                break;
            }
        }
    }
    let ctx = &entered.ctx;
    tracing::info!(
        %peer,
        reservation = %ctx.reservation_id,
        via = %ctx.via,
        bytes_in = ctx.bytes_in.load(std::sync::atomic::Ordering::Relaxed),
        bytes_out = ctx.bytes_out.load(std::sync::atomic::Ordering::Relaxed),
        "ssh: connection closed"
    );
}
