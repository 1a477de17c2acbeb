//! Teams (`gpurent teams`): a shared balance, members with roles, and the reservations made for
//! it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Money, TeamRole};

/// A team as its members see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Team {
    pub id: String,
    pub name: String,
    /// What its reservations are paid from.
    pub balance: Money,
    pub created_at: DateTime<Utc>,
    /// The caller's role in it (none: a platform admin looking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<TeamRole>,
    /// Its members, by name (in `teams get`; empty in lists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<TeamMember>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TeamMember {
    pub user_id: String,
    pub name: String,
    pub role: TeamRole,
    pub added_at: DateTime<Utc>,
}

/// The body of `POST /api/v1/teams`: its maker is its first owner.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTeam {
    /// Letters, digits, `-`, `_` and `.`; unique among users and teams.
    pub name: String,
}

/// The body of `PUT /api/v1/teams/{name}/members/{user}`: adds the user, or changes their
/// role.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetMember {
    pub role: TeamRole,
}

/// The body of `POST /api/v1/teams/{name}/credit`: moves the caller's own credit into the
/// team's balance.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveCredit {
    pub amount: Money,
}

/// What a move of credit left: both balances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreditMoved {
    pub amount: Money,
    /// The caller's balance after it.
    pub balance: Money,
    /// The team's balance after it.
    pub team_balance: Money,
}
