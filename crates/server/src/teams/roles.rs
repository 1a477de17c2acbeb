//! What each role in a team may do: one table, the least role for each action. A platform
//! admin may do everything in every team.

use gpurent_store::AuthUser;
use gpurent_types::{Role, TeamRole, TokenScope};

use crate::error::ApiError;

/// Something a member does in a team or to its reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TeamAction {
    /// See the team, its members, its reservations and their logs.
    See,
    /// Make reservations paid from its balance.
    Reserve,
    /// Stop its reservations.
    Stop,
    /// Enter its running instances (SSH, the web terminal, files).
    Enter,
    /// Add, change and remove members below owner.
    ManageMembers,
    /// Make, change or remove an owner.
    ManageOwners,
    /// Move one's own credit into it.
    MoveCredit,
    /// Set or remove its monthly budget.
    SetBudget,
    /// Add, see and remove its webhooks.
    ManageNotifications,
    /// Remove its volumes and their data.
    RemoveVolumes,
}

/// The least role for each action.
const RULES: &[(TeamAction, TeamRole)] = &[
    (TeamAction::See, TeamRole::Viewer),
    (TeamAction::Reserve, TeamRole::Member),
    (TeamAction::Stop, TeamRole::Member),
    (TeamAction::Enter, TeamRole::Member),
    (TeamAction::ManageMembers, TeamRole::Admin),
    (TeamAction::ManageOwners, TeamRole::Owner),
    (TeamAction::MoveCredit, TeamRole::Owner),
    (TeamAction::SetBudget, TeamRole::Admin),
    (TeamAction::ManageNotifications, TeamRole::Admin),
    (TeamAction::RemoveVolumes, TeamRole::Admin),
];

impl TeamAction {
    fn least(self) -> TeamRole {
        RULES
            .iter()
            .find(|(action, _)| *action == self)
            .map_or(TeamRole::Owner, |(_, role)| *role)
    }

    fn words(self) -> &'static str {
        match self {
            TeamAction::See => "seeing it",
            TeamAction::Reserve => "reserving for it",
            TeamAction::Stop => "stopping its reservations",
            TeamAction::Enter => "entering its instances",
            TeamAction::ManageMembers => "managing its members",
            TeamAction::ManageOwners => "managing its owners",
            TeamAction::MoveCredit => "moving credit into it",
            TeamAction::SetBudget => "setting its budget",
            TeamAction::ManageNotifications => "managing its webhooks",
            TeamAction::RemoveVolumes => "removing its volumes",
        }
    }
}

/// What a token scope bound to a team amounts to there (`tokens create --team --scope`).
pub(crate) fn action_of(scope: TokenScope) -> TeamAction {
    match scope {
        TokenScope::Read | TokenScope::Billing => TeamAction::See,
        TokenScope::Reserve | TokenScope::Volumes => TeamAction::Reserve,
        TokenScope::Ssh => TeamAction::Enter,
        TokenScope::Admin => TeamAction::ManageMembers,
    }
}

/// Whether a member with `role` may do `action`.
pub(crate) fn may(role: TeamRole, action: TeamAction) -> bool {
    role.at_least(action.least())
}

/// The caller's role in a team for what they may do there: theirs, or an owner's for a platform
/// admin who is not a member.
pub(crate) fn effective(caller: &AuthUser, role: Option<TeamRole>) -> Option<TeamRole> {
    role.or((caller.role == Role::Admin).then_some(TeamRole::Owner))
}

/// Ok when `role` may do `action` in `team`; else a 403 saying which role it needs.
pub(crate) fn require(team: &str, role: TeamRole, action: TeamAction) -> Result<(), ApiError> {
    if may(role, action) {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "your role in team {team} is {role}: {} needs {} or above",
        action.words(),
        action.least()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_has_its_least_role_and_roles_are_ordered() {
        use TeamAction::*;
        let actions = [
            See,
            Reserve,
            Stop,
            Enter,
            ManageMembers,
            ManageOwners,
            MoveCredit,
            SetBudget,
            ManageNotifications,
            RemoveVolumes,
        ];
        for action in actions {
            assert!(RULES.iter().any(|(a, _)| *a == action), "{action:?}");
            assert!(may(TeamRole::Owner, action), "an owner may {action:?}");
        }
        assert!(may(TeamRole::Viewer, See));
        assert!(!may(TeamRole::Viewer, Stop) && !may(TeamRole::Viewer, Reserve));
        assert!(may(TeamRole::Member, Reserve) && !may(TeamRole::Member, ManageMembers));
        assert!(may(TeamRole::Admin, ManageMembers) && !may(TeamRole::Admin, ManageOwners));
        assert!(!may(TeamRole::Admin, MoveCredit));
        let message = require("lab", TeamRole::Viewer, Stop)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("viewer") && message.contains("member or above"),
            "{message}"
        );
    }
}
