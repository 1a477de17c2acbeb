//! The russh `Handler` of one SSH connection: public-key auth through [`super::auth`], and
//! session channels. The relay of channels to the instance's agent is not built yet: a
//! shell, exec or subsystem request is answered with a message and exit status 1.

use std::sync::Arc;

use gpurent_store::Store;
use russh::server::{Auth, ChannelOpenHandle, Msg, PublicKeyOffer, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, ChannelOpenFailure, Disconnect};
use tokio::sync::oneshot;

use super::auth::{decide, Decision};

/// What a client gets, for now, once it is in.
pub const NOT_AVAILABLE: &str =
    "gpurent: connecting to instances is not available yet on this control plane\n";

#[derive(Debug)]
pub struct Connection {
    store: Arc<dyn Store>,
    peer: Option<std::net::SocketAddr>,
    /// What the last proven key was decided to get.
    decision: Option<Decision>,
    /// Tells the connection's task that auth succeeded (its pre-auth deadline stops).
    authenticated: Option<oneshot::Sender<()>>,
}

impl Connection {
    pub fn new(
        store: Arc<dyn Store>,
        peer: Option<std::net::SocketAddr>,
        authenticated: oneshot::Sender<()>,
    ) -> Connection {
        Connection {
            store,
            peer,
            decision: None,
            authenticated: Some(authenticated),
        }
    }

    /// Answers a shell, exec or subsystem request on `channel`.
    ///
    /// THE RELAY GOES HERE: once agents hold a connection to the control plane, this opens a
    /// stream to the reservation's agent and pipes the channel (data both ways, window
    /// changes, signals, the exit status) through it. Until then: a message and status 1.
    fn not_available(&self, channel: ChannelId, session: &mut Session) -> Result<(), russh::Error> {
        session.channel_success(channel)?;
        session.extended_data(channel, 1, NOT_AVAILABLE.as_bytes())?;
        session.exit_status_request(channel, 1)?;
        session.eof(channel)?;
        session.close(channel)
    }
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
        self.decision = Some(decision);
        Ok(auth)
    }

    async fn auth_succeeded(&mut self, session: &mut Session) -> Result<(), Self::Error> {
        if let Some(tx) = self.authenticated.take() {
            let _ = tx.send(());
        }
        if let Some(Decision::NotRunning { message }) = &self.decision {
            // OpenSSH prints "Received disconnect from HOST port PORT:11: MESSAGE".
            session.disconnect(Disconnect::ByApplication, message, "")?;
        }
        Ok(())
    }

    async fn channel_open_session(
        &mut self,
        _channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if matches!(self.decision, Some(Decision::Enter { .. })) {
            reply.accept().await;
        } else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
        }
        Ok(())
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.not_available(channel, session)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.not_available(channel, session)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        _name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.not_available(channel, session)
    }
}
