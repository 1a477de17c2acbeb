//! The control plane's HTTP proxy to published ports: its one-time links and the browser
//! sessions they open (`ProxyStore`, implemented in `sql/proxy.rs`), kept by their tokens'
//! hashes so that every replica honours them.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::Result;

/// A one-time link (opened on the console's site, by its owner only), the one-time ticket
/// that carries the owner from there to the apps' site, or the session a ticket opened there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyTokenKind {
    Link,
    Ticket,
    Session,
}

impl ProxyTokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyTokenKind::Link => "link",
            ProxyTokenKind::Ticket => "ticket",
            ProxyTokenKind::Session => "session",
        }
    }
}

/// What a proxy token lets in: one port of one reservation, for its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyGrant {
    pub reservation_id: String,
    pub port: u16,
    pub user_id: String,
}

#[async_trait]
pub trait ProxyStore: Send + Sync {
    /// Keeps a new token (by its hash) until `expires_at`; forgets the expired ones.
    async fn add_proxy_token(
        &self,
        kind: ProxyTokenKind,
        token_hash: &str,
        grant: &ProxyGrant,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// The grant of a one-time link or ticket that is still valid and unused, without using
    /// it (to say whose it is before anything is done).
    async fn peek_proxy_token(
        &self,
        kind: ProxyTokenKind,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<ProxyGrant>>;

    /// Uses a one-time link or ticket for `reservation_id`'s `port`: its grant the first
    /// time, while it is valid; None ever after (or for another reservation or port).
    async fn redeem_proxy_token(
        &self,
        kind: ProxyTokenKind,
        token_hash: &str,
        reservation_id: &str,
        port: u16,
        now: DateTime<Utc>,
    ) -> Result<Option<ProxyGrant>>;

    /// The grant of a valid session token.
    async fn proxy_session(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<ProxyGrant>>;
}
