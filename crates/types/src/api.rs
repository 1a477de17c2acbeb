//! Request and response bodies of the public HTTP API (`/api/v1`), named as the CLI names them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Money, Role};

mod audit;
mod books;
mod budgets;
mod endpoints;
mod nodes;
mod notifications;
mod quotas;
mod registries;
mod reservations;
mod teams;
mod templates;
mod volumes;

pub use audit::*;
pub use books::*;
pub use budgets::*;
pub use endpoints::*;
pub use nodes::*;
pub use notifications::*;
pub use quotas::*;
pub use registries::*;
pub use reservations::*;
pub use teams::*;
pub use templates::*;
pub use volumes::*;

pub use crate::access_api::{
    AddSshKey, CreateToken, Login, Session, SetPassword, SshKey, Token, TokenCreated, UpdateUser,
};

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable snake_case word: `no_capacity`, `insufficient_credit`, `not_found`, ...
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// 1 to 64 letters, digits and `_ - . @`.
    #[schema(pattern = r"^[A-Za-z0-9_.@-]{1,64}$")]
    pub name: String,
    #[serde(default)]
    pub role: Option<Role>,
    /// Prepaid credit granted on creation.
    #[serde(default)]
    pub credit: Option<Money>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UserCreated {
    pub id: String,
    pub name: String,
    pub role: Role,
    /// The user's API token. Shown once; only its hash is stored.
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct User {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub balance: Money,
    pub created_at: DateTime<Utc>,
    /// Its override of the platform's cap on live reservations (none: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reservations: Option<u32>,
    /// Its override of the platform's cap on spend per hour (none: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_spend_per_hour: Option<Money>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantCredit {
    pub amount: Money,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreditGranted {
    pub user_id: String,
    pub balance: Money,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Balance {
    /// What the user may spend.
    pub balance: Money,
    pub currency: String,
    /// Set aside for the user's reservations: a first hour not yet settled, or the unused
    /// part of a prepaid reserved block.
    #[serde(default)]
    pub held: Money,
    /// Earned as the owner of nodes.
    #[serde(default)]
    pub earnings: Money,
}
