//! Logins (and their throttling), API tokens (expiry, revocation) and per-tenant caps: the
//! store's side of authorization (`AccessStore`, in `sql/access.rs`, `sql/login_throttle.rs`
//! and `sql/caps.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::Token;
use gpurent_types::login_throttle::Verdict;
use gpurent_types::{Money, TokenScope};

use crate::{AuthUser, Result};

/// What a bearer token's hash turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenCheck {
    Valid(AuthUser, TokenFacts),
    Expired(DateTime<Utc>),
    Revoked(DateTime<Utc>),
    Unknown,
}

/// The token a request was authenticated with: what a token made with it inherits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFacts {
    pub id: String,
    pub expires_at: Option<DateTime<Utc>>,
    /// For a login session (a token of kind `session`): when the login made it. `None` for
    /// an API token made deliberately.
    pub login_at: Option<DateTime<Utc>>,
    /// What it may do; `None`: everything its user may.
    pub scopes: Option<Vec<TokenScope>>,
    /// The team it acts for.
    pub team_id: Option<String>,
}

impl TokenFacts {
    /// Whether it may do what `scope` covers.
    pub fn allows(&self, scope: TokenScope) -> bool {
        self.scopes.as_ref().is_none_or(|s| s.contains(&scope))
    }
}

/// A token to store: only its hash, never the secret.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub user_id: String,
    pub token_hash: String,
    /// `api` or `session`.
    pub kind: &'static str,
    pub name: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
    /// The token it was made with: revoking that one revokes this one too.
    pub parent_id: Option<String>,
    /// What it may do; `None`: everything its user may.
    pub scopes: Option<Vec<TokenScope>>,
    /// The team it acts for.
    pub team_id: Option<String>,
}

/// The platform's caps on one tenant's live reservations (`pending`, `starting`, `running`);
/// a user's own override (`PATCH /api/v1/users/{id}`) replaces each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantLimits {
    pub max_reservations: u32,
    /// The most the `price_per_hour` of its live reservations may add up to.
    pub max_spend_per_hour: Money,
}

impl TenantLimits {
    /// No cap at all (the store's own tests, and `--max-reservations-per-tenant 0`).
    pub const UNLIMITED: TenantLimits = TenantLimits {
        max_reservations: u32::MAX,
        max_spend_per_hour: Money::from_micros(i64::MAX),
    };
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            max_reservations: 32,
            max_spend_per_hour: Money::from_micros(80_000_000),
        }
    }
}

/// A user's login facts: its id and password hash (none: it has no password).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginFacts {
    pub user_id: String,
    pub password_hash: Option<String>,
}

#[async_trait]
pub trait AccessStore: Send + Sync {
    /// The user a token hash belongs to, or why it does not authenticate at `now`.
    async fn check_token(&self, token_hash: &str, now: DateTime<Utc>) -> Result<TokenCheck>;

    async fn create_token(&self, new: NewToken, now: DateTime<Utc>) -> Result<Token>;

    /// Tokens of `user_id` (all users' for `None`), newest first, at most `limit` after the
    /// token `after`.
    async fn list_tokens(
        &self,
        user_id: Option<&str>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Vec<Token>>;

    /// Revokes token `id` of `user_id` (any user's for `None`) and every token made from it,
    /// down its lineage; a revoked one stays revoked at its first time. NotFound for another
    /// user's token, as for none.
    async fn revoke_token(
        &self,
        id: &str,
        user_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Token>;

    /// Forgets tokens that expired or were revoked before `before`. Returns how many.
    async fn prune_tokens(&self, before: DateTime<Utc>) -> Result<u64>;

    /// Sets a user's password hash (an argon2id PHC string) and, in the same transaction,
    /// revokes every login session of the user (and the tokens made from them) but `keep`.
    /// Returns how many sessions it ended.
    async fn set_password(
        &self,
        user_id: &str,
        password_hash: &str,
        keep: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<u64>;

    /// A login try of `account` (a user's id, or a key standing for a name that is no
    /// user's: `user_id` `None`) at `now`, applying `gpurent_types::login_throttle::attempt`
    /// to what is kept of it, in one transaction: whether to check the password or refuse
    /// until when. A burst of a user's failures is written as an event (`login_burst`).
    async fn login_attempt(
        &self,
        account: &str,
        user_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Verdict>;

    /// The password was right: the account's failures are forgotten.
    async fn login_succeeded(&self, account: &str) -> Result<()>;

    /// Forgets failures older than `before`, and all but the newest `keep_unknown` of names
    /// that are no user's. Returns how many rows it removed.
    async fn prune_login_throttle(&self, before: DateTime<Utc>, keep_unknown: u32) -> Result<u64>;

    /// The login facts of the user named `name`, if any.
    async fn login_facts(&self, name: &str) -> Result<Option<LoginFacts>>;

    /// Gives a user another role; the last admin cannot lose it (`Conflict`).
    async fn set_role(
        &self,
        user_id: &str,
        role: gpurent_types::Role,
    ) -> Result<gpurent_types::api::User>;

    /// Sets a user's overrides of the caps (`None` leaves one as it is).
    async fn set_limits(
        &self,
        user_id: &str,
        max_reservations: Option<u32>,
        max_spend_per_hour: Option<Money>,
    ) -> Result<gpurent_types::api::User>;
}
