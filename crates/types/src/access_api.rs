//! Request and response bodies of logins, passwords, API tokens and per-tenant caps
//! (re-exported by `api`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Money, TokenScope};

/// `POST /api/v1/login`: a console login by name and password.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Login {
    pub name: String,
    pub password: String,
}

/// A session token from a login: a `gpr_` token like any other, until `expires_at`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub user_id: String,
    pub token_id: String,
    /// Shown once; only its hash is stored.
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

/// `POST /api/v1/users/{id}/password`.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPassword {
    /// 8 to 1024 characters.
    #[schema(min_length = 8, max_length = 1024)]
    pub password: String,
    /// The caller's own password: always needed to change your own once you have one, and
    /// for an admin setting another user's when its login session is older than 5 minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 1024)]
    pub current_password: Option<String>,
}

impl std::fmt::Debug for SetPassword {
    /// Without the passwords.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetPassword").finish_non_exhaustive()
    }
}

/// `POST /api/v1/tokens`: a new API token of the caller.
#[derive(Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// A label to recognise it by in `tokens ls`.
    #[serde(default)]
    pub name: Option<String>,
    /// Valid for this many days (1 to 3650), and never longer than the token that makes it
    /// (which revokes it when it is revoked). Without it: as long as that token, and a token
    /// that never expires only for an admin or with `password`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 3650)]
    pub expires_in_days: Option<u32>,
    /// The caller's password: the new token is then a credential of its own, neither bound
    /// to the token of this request nor limited by its expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 1024)]
    pub password: Option<String>,
    /// What it may do (none: everything its maker may). Never more than the token that makes
    /// it, nor, with `team`, than the maker's role there allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<TokenScope>>,
    /// Bind it to a team of the maker's: it acts for that team (its reservations are the
    /// team's) and sees only the team's reservations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

impl std::fmt::Debug for CreateToken {
    /// Without the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateToken")
            .field("name", &self.name)
            .field("expires_in_days", &self.expires_in_days)
            .field("scopes", &self.scopes)
            .field("team", &self.team)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// An API or session token as listed: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Token {
    pub id: String,
    pub user_id: String,
    /// `api` (created by `users create` or `tokens create`) or `session` (a login).
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub revoked_at: Option<DateTime<Utc>>,
    /// What it may do; none: everything its user may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<TokenScope>>,
    /// The team it acts for, by id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
}

/// A token just created: its secret is shown this once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    #[serde(flatten)]
    pub info: Token,
    pub token: String,
}

/// `PATCH /api/v1/users/{id}` (admin): a new role, and per-tenant overrides of the platform's caps.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateUser {
    /// Most live reservations at once.
    #[serde(default)]
    #[schema(maximum = 1_000_000)]
    pub max_reservations: Option<u32>,
    /// Most spend per hour: the sum of `price_per_hour` of its live reservations.
    #[serde(default)]
    pub max_spend_per_hour: Option<Money>,
    /// A new role. The last admin cannot lose it (409).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<crate::Role>,
}

/// `POST /api/v1/ssh-keys`: an OpenSSH public key of the caller (one line, as in
/// `~/.ssh/id_ed25519.pub`): ed25519, ECDSA, or RSA of at least 3072 bits.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddSshKey {
    #[schema(min_length = 1, max_length = 16384)]
    pub public_key: String,
    /// A label for `keys ls`; the key's comment when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 100)]
    pub name: Option<String>,
    /// The caller's password: needed when the request comes with a login session (the
    /// console's, or `gpurent login`'s) older than 5 minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 1024)]
    pub password: Option<String>,
}

impl std::fmt::Debug for AddSshKey {
    /// Without the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddSshKey")
            .field("public_key", &self.public_key)
            .field("name", &self.name)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// An SSH public key of a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SshKey {
    pub id: String,
    pub user_id: String,
    pub name: String,
    /// `ssh-ed25519`, `ecdsa-sha2-nistp256`, `ssh-rsa`, ...
    pub algorithm: String,
    /// `SHA256:...`, as `ssh-keygen -lf` prints it.
    pub fingerprint: String,
    /// The key in OpenSSH's one-line form, without its comment.
    pub public_key: String,
    pub created_at: DateTime<Utc>,
}
