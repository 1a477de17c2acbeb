//! The russh `Handler` of one SSH connection: public-key auth through [`super::auth`]; then
//! session channels and `direct-tcpip` channels, each relayed to the instance
//! ([`super::relay`]) within the reservation's caps ([`super::sessions`]).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use gpurent_store::Store;
use russh::keys::ssh_key::PublicKey;
use russh::server::{Auth, ChannelOpenHandle, Msg, PublicKeyOffer, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, ChannelOpenFailure, Disconnect};
use tokio::sync::oneshot;

use super::auth::{decide, Decision};
use super::relay::{self, RelayContext, Via};
use super::sessions::{Sessions, Slot};
use crate::state::AppState;

/// Who got in: the connection's task re-checks this key and reservation while it is open.
#[derive(Debug, Clone)]
pub struct Entered {
    pub user: String,
    pub key: PublicKey,
    pub ctx: Arc<RelayContext>,
}

#[derive(Debug)]
pub struct Connection {
    store: Arc<dyn Store>,
    state: AppState,
    sessions: Arc<Sessions>,
    peer: Option<std::net::SocketAddr>,
    /// What the last proven key was decided to get, and the key.
    decision: Option<(Decision, String, PublicKey)>,
    ctx: Option<Arc<RelayContext>>,
    /// Tells the connection's task that auth succeeded (its pre-auth deadline stops).
    authenticated: Option<oneshot::Sender<Entered>>,
}

impl Connection {
    pub fn new(
        state: AppState,
        sessions: Arc<Sessions>,
        peer: Option<std::net::SocketAddr>,
        authenticated: oneshot::Sender<Entered>,
    ) -> Connection {
        Connection {
            store: state.store.clone(),
            state,
            sessions,
            peer,
            decision: None,
            ctx: None,
            authenticated: Some(authenticated),
        }
    }
}

/// Forwarded connections may go to the instance's own loopback only (its ports).
fn is_instance_host(host: &str) -> bool {
    matches!(
        host,
        "localhost" | "127.0.0.1" | "::1" | "[::1]" | "0.0.0.0"
    )
}

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        // Only keys that may get a verdict are worth a signature.
        Ok(match decide(&*self.store, user, offer.public_key).await {
            Decision::Refuse => Auth::reject(),
            _ => Auth::Accept,
        })
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        let decision = decide(&*self.store, user, key.public_key).await;
        tracing::info!(peer = ?self.peer, user, ?decision, "ssh: public key proven");
        let auth = match decision {
            Decision::Refuse => Auth::reject(),
            // The owner's key with a reservation that does not run: let them in only to
            // tell them why and disconnect at once (russh sends its banner before the user
            // name is known, so the refusal itself cannot carry the message).
            Decision::Enter { .. } | Decision::NotRunning { .. } => Auth::Accept,
        };
        self.decision = Some((decision, user.to_owned(), key.public_key.clone()));
        Ok(auth)
    }

    async fn auth_succeeded(&mut self, session: &mut Session) -> Result<(), Self::Error> {
        match self.decision.clone() {
            Some((Decision::NotRunning { message }, _, _)) => {
                // OpenSSH prints "Received disconnect from HOST port PORT:11: MESSAGE".
                session.disconnect(Disconnect::ByApplication, &message, "")?;
            }
            Some((
                Decision::Enter {
                    reservation_id,
                    tenant_id,
                },
                user,
                key,
            )) => {
                let ctx = Arc::new(RelayContext {
                    store: self.state.store.clone(),
                    tunnels: self.state.tunnels.clone(),
                    metrics: self.state.metrics.clone(),
                    audit: self.state.audit.clone(),
                    reservation_id,
                    user_id: tenant_id,
                    peer: self.peer,
                    via: Via::Ssh {
                        fingerprint: key.fingerprint(Default::default()).to_string(),
                    },
                    activity: self.state.activity.clone(),
                    bytes_in: AtomicU64::new(0),
                    bytes_out: AtomicU64::new(0),
                });
                self.ctx = Some(ctx.clone());
                if let Some(tx) = self.authenticated.take() {
                    let _ = tx.send(Entered { user, key, ctx });
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(ctx) = self.ctx.clone() else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let Some(slot) = self.sessions.session(&ctx.reservation_id) else {
            tracing::info!(reservation = %ctx.reservation_id, "ssh: too many sessions");
            reply.reject(ChannelOpenFailure::ResourceShortage).await;
            return Ok(());
        };
        reply.accept().await;
        let handle = session.handle();
        tokio::spawn(async move {
            let _slot: Slot = slot;
            relay::session(channel, ctx, handle).await;
        });
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(ctx) = self.ctx.clone() else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let port = match u16::try_from(port_to_connect) {
            Ok(p) if p > 0 && is_instance_host(host_to_connect) => p,
            _ => {
                tracing::info!(reservation = %ctx.reservation_id, host_to_connect, port_to_connect,
                    "ssh: forwarding refused: only ports of the instance itself (localhost)");
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
                return Ok(());
            }
        };
        let Some(slot) = self.sessions.forward(&ctx.reservation_id) else {
            reply.reject(ChannelOpenFailure::ResourceShortage).await;
            return Ok(());
        };
        // The dial waits for the agent; the connection's other channels go on meanwhile.
        tokio::spawn(async move {
            match relay::dial_port(&ctx, port).await {
                Ok(stream) => {
                    reply.accept().await;
                    let _slot: Slot = slot;
                    relay::forwarded(channel, stream, ctx, port).await;
                }
                Err(why) => {
                    tracing::info!(reservation = %ctx.reservation_id, port, %why, "ssh: forwarding failed");
                    reply.reject(ChannelOpenFailure::ConnectFailed).await;
                    relay::forward_refused(&ctx, port).await;
                }
            }
        });
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _col_width: u32,
        _row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        _variable_name: &str,
        _variable_value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name == "sftp" {
            session.channel_success(channel)
        } else {
            session.channel_failure(channel)
        }
    }
}
