//! Teams: the store's side of `gpurent teams` and `credit move` (`TeamStore`, implemented in
//! `sql/teams.rs`). A team is a tenant of its own (a users row of kind `team`), so its balance,
//! holds and statements are any tenant's; who may do what in it is the server's to decide.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{Team, TeamMember};
use gpurent_types::{Money, TeamRole};

use crate::Result;

#[async_trait]
pub trait TeamStore: Send + Sync {
    /// Makes the team, `owner_id` its first owner. `Conflict` when a user or team has the name.
    async fn create_team(&self, name: &str, owner_id: &str, now: DateTime<Utc>) -> Result<Team>;

    /// The team named `name` (without its members or a role); `NotFound` when there is none.
    async fn team_by_name(&self, name: &str) -> Result<Team>;

    /// The teams `user_id` is a member of, with their role in each; every team for `None`.
    async fn list_teams(&self, user_id: Option<&str>) -> Result<Vec<Team>>;

    /// Its members, owners first, then by name.
    async fn team_members(&self, team_id: &str) -> Result<Vec<TeamMember>>;

    /// The id of the user (not a team) named `name`; `NotFound` when there is none.
    async fn user_id_by_name(&self, name: &str) -> Result<String>;

    /// The role of `user_id` in the team, if a member.
    async fn team_role(&self, team_id: &str, user_id: &str) -> Result<Option<TeamRole>>;

    /// Adds the user with `role`, or changes their role. `Conflict` when that would leave the
    /// team without an owner; `NotFound` for an unknown user; `OwnerUntouched` when they are
    /// an owner and `owners_too` is false (read under the team's lock).
    async fn set_member(
        &self,
        team_id: &str,
        user_id: &str,
        role: TeamRole,
        owners_too: bool,
        now: DateTime<Utc>,
    ) -> Result<TeamMember>;

    /// Removes the member. `Conflict` for its last owner; `NotFound` for a non-member;
    /// `OwnerUntouched` for an owner when `owners_too` is false.
    async fn remove_member(
        &self,
        team_id: &str,
        user_id: &str,
        owners_too: bool,
    ) -> Result<TeamMember>;

    /// Moves `amount` of `user_id`'s own credit into the team's balance, once per
    /// `transfer_id` (a retry with another amount is `IdempotencyMismatch`).
    /// `InsufficientCredit` beyond their balance. Both balances after it.
    async fn move_credit(
        &self,
        user_id: &str,
        team_id: &str,
        amount: Money,
        transfer_id: &str,
        now: DateTime<Utc>,
    ) -> Result<(Money, Money)>;
}
