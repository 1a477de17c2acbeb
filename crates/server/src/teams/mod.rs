//! Teams: the routes of `gpurent teams` and `credit move`, and what a member may do to a
//! team's reservations (`reservation_action`). A team is a tenant of its own: its reservations
//! are paid from its balance; its members see them, and act on them as their role allows
//! (`roles.rs`). Docs: docs/teams.md.

pub(crate) mod roles;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use gpurent_store::AuthUser;
use gpurent_types::api::{
    CreateTeam, CreditMoved, ErrorBody, MoveCredit, Reservation, SetMember, Team, TeamMember,
};
use gpurent_types::{Role, TeamRole};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{idempotency_key, ApiJson, ApiPath};
use crate::state::AppState;
pub(crate) use roles::TeamAction;
use roles::{effective, require};

/// The team named `name` and the caller's role for acting in it; a team they are not in (or
/// not the one their token is bound to) is a 404, as one that does not exist.
async fn team_for(
    state: &AppState,
    caller: &Caller,
    name: &str,
) -> Result<(Team, TeamRole), ApiError> {
    let not_found = || ApiError::Store(gpurent_store::StoreError::not_found("team", name));
    let team = state.store.team_by_name(name).await?;
    if caller
        .1
        .team_id
        .as_ref()
        .is_some_and(|bound| *bound != team.id)
    {
        return Err(not_found());
    }
    let role = state.store.team_role(&team.id, &caller.0.id).await?;
    let role = effective(&caller.0, role).ok_or_else(not_found)?;
    Ok((team, role))
}

/// A token bound to a team works only while its maker is a member of it (a platform admin's
/// always): checked on every request it makes.
pub(crate) async fn still_member(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    let Some(team) = &caller.1.team_id else {
        return Ok(());
    };
    if caller.is_admin() || state.store.team_role(team, &caller.0.id).await?.is_some() {
        return Ok(());
    }
    Err(ApiError::Forbidden(
        "this token acts for a team its maker is no longer a member of".into(),
    ))
}

/// Whether the caller may do `action` to a reservation they can see: theirs, any for a
/// platform admin, else their team's as their role there allows (a 403 saying which role it
/// needs).
pub(crate) async fn reservation_action(
    state: &AppState,
    caller: &AuthUser,
    reservation: &Reservation,
    action: TeamAction,
) -> Result<(), ApiError> {
    if caller.role == Role::Admin || reservation.tenant_id == caller.id {
        return Ok(());
    }
    let role = state
        .store
        .team_role(&reservation.tenant_id, &caller.id)
        .await?
        .ok_or_else(|| {
            ApiError::Store(gpurent_store::StoreError::not_found(
                "reservation",
                &reservation.id,
            ))
        })?;
    let team = reservation
        .team
        .as_deref()
        .unwrap_or(&reservation.tenant_id);
    require(team, role, action)
}

/// Whether `user_id` may open `reservation`'s published ports: its owner, or a member of its
/// team whose role may enter its instances. A platform admin is no exception: an app is its
/// tenant's alone. Read on every request, so a removed member's access ends at once.
pub(crate) async fn may_open_apps(
    state: &AppState,
    user_id: &str,
    reservation: &Reservation,
) -> bool {
    if reservation.tenant_id == user_id {
        return true;
    }
    if reservation.team.is_none() {
        return false;
    }
    match state.store.team_role(&reservation.tenant_id, user_id).await {
        Ok(Some(role)) => roles::may(role, TeamAction::Enter),
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(error = %e, "proxy: cannot read a team role; refused");
            false
        }
    }
}

/// A user's own budget and webhooks are account settings, as `Need::Unscoped` routes are: a
/// token with scopes manages a team's (`personal`: false), never its maker's own.
pub(crate) fn own_settings_unscoped(caller: &Caller, personal: bool) -> Result<(), ApiError> {
    if personal && caller.1.scopes.is_some() && !caller.is_admin() {
        return Err(ApiError::Forbidden(
            "a token with scopes does not change its maker's own account settings; use a \
             token without scopes, or name a team"
                .into(),
        ));
    }
    Ok(())
}

/// The tenant a new reservation is made for: the caller, or the team it names (or the team
/// the caller's token acts for) when the caller may reserve for it.
pub(crate) async fn payer(
    state: &AppState,
    caller: &Caller,
    team: Option<&str>,
) -> Result<Payer, ApiError> {
    acting_for(state, caller, team, TeamAction::Reserve).await
}

/// The tenant the caller acts for: themselves, or the team named (or the team their token
/// acts for) when their role there allows `action`.
pub(crate) async fn acting_for(
    state: &AppState,
    caller: &Caller,
    team: Option<&str>,
    action: TeamAction,
) -> Result<Payer, ApiError> {
    let user = &caller.0;
    let (id, name, role) = match (team, &caller.1.team_id) {
        (None, None) => {
            return Ok(Payer {
                tenant_id: user.id.clone(),
                team: None,
            })
        }
        // Another team than the token's is a 404 (`team_for`).
        (Some(name), _) => {
            let (team, role) = team_for(state, caller, name).await?;
            (team.id, team.name, role)
        }
        // `authorize` checked that the maker is still a member (`still_member`).
        (None, Some(bound)) => {
            let role = state.store.team_role(bound, &user.id).await?;
            let role = effective(user, role).ok_or_else(|| {
                ApiError::Forbidden(
                    "this token acts for a team you are no longer a member of".into(),
                )
            })?;
            let name = state.store.get_user(bound).await?.name;
            (bound.clone(), name, role)
        }
    };
    require(&name, role, action)?;
    Ok(Payer {
        tenant_id: id,
        team: Some(name),
    })
}

/// Who a new reservation is for.
pub(crate) struct Payer {
    /// Its tenant: the caller, or the team.
    pub tenant_id: String,
    /// The team's name, where it is a team's (then the caller is its `created_by`).
    pub team: Option<String>,
}

/// The team a new token is bound to (`tokens create --team`): one the caller is a member of,
/// and the one their own token is bound to, if it is; each scope it asks for within what their
/// role there allows.
pub(crate) async fn token_team(
    state: &AppState,
    caller: &Caller,
    name: Option<&str>,
    scopes: Option<&[gpurent_types::TokenScope]>,
) -> Result<Option<String>, ApiError> {
    let Some(name) = name else {
        return Ok(caller.1.team_id.clone());
    };
    let (team, role) = team_for(state, caller, name).await?;
    for scope in scopes.unwrap_or(gpurent_types::TokenScope::ALL) {
        require(&team.name, role, roles::action_of(*scope))?;
    }
    Ok(Some(team.id))
}

/// Make a team: you are its first owner. Its name is unique among users and teams.
#[utoipa::path(post, path = "/api/v1/teams", tag = "teams", security(("bearer" = [])),
    request_body = CreateTeam,
    responses((status = 201, body = Team), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateTeam>,
) -> Result<(StatusCode, Json<Team>), ApiError> {
    crate::validate::resource_name(&body.name)?;
    let team = state
        .store
        .create_team(&body.name, &caller.0.id, state.now())
        .await?;
    tracing::info!(team = %team.name, owner = %caller.0.id, "team created");
    Ok((StatusCode::CREATED, Json(team)))
}

/// Your teams and your role in each (a platform admin: every team).
#[utoipa::path(get, path = "/api/v1/teams", tag = "teams", security(("bearer" = [])),
    responses((status = 200, body = [Team])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<Team>>, ApiError> {
    let whose = (caller.0.role != Role::Admin).then_some(caller.0.id.as_str());
    let mut teams = state.store.list_teams(whose).await?;
    // A token bound to a team sees that one only.
    if let Some(bound) = &caller.1.team_id {
        teams.retain(|t| t.id == *bound);
    }
    Ok(Json(teams))
}

/// A team of yours, with its members.
#[utoipa::path(get, path = "/api/v1/teams/{name}", tag = "teams", security(("bearer" = [])),
    params(("name" = String, Path)),
    responses((status = 200, body = Team), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Team>, ApiError> {
    let (mut team, _) = team_for(&state, &caller, &name).await?;
    team.role = state.store.team_role(&team.id, &caller.0.id).await?;
    team.members = state.store.team_members(&team.id).await?;
    Ok(Json(team))
}

/// Add a user to a team, or change their role (an admin of the team: below owner; an owner:
/// any role).
#[utoipa::path(put, path = "/api/v1/teams/{name}/members/{user}", tag = "teams",
    security(("bearer" = [])),
    params(("name" = String, Path), ("user" = String, Path, description = "A user's name")),
    request_body = SetMember,
    responses((status = 200, body = TeamMember), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn set_member(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, user)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<SetMember>,
) -> Result<Json<TeamMember>, ApiError> {
    let (team, role) = team_for(&state, &caller, &name).await?;
    require(&team.name, role, TeamAction::ManageMembers)?;
    let user_id = state.store.user_id_by_name(&user).await?;
    if body.role == TeamRole::Owner {
        require(&team.name, role, TeamAction::ManageOwners)?;
    }
    // Whether an owner may be changed is decided here and held by the store under the team's
    // lock: a member made owner meanwhile is not changed by an admin.
    let owners_too = roles::may(role, TeamAction::ManageOwners);
    let member = state
        .store
        .set_member(&team.id, &user_id, body.role, owners_too, state.now())
        .await
        .map_err(|e| owner_refused(e, &team.name, role))?;
    tracing::info!(team = %team.name, user = %user, role = %body.role, by = %caller.0.id, "team member set");
    Ok(Json(member))
}

/// Remove a member (an admin of the team: below owner; an owner: anyone). Anyone may leave a
/// team; its last owner may not.
#[utoipa::path(delete, path = "/api/v1/teams/{name}/members/{user}", tag = "teams",
    security(("bearer" = [])),
    params(("name" = String, Path), ("user" = String, Path, description = "A user's name")),
    responses((status = 200, body = TeamMember), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn remove_member(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, user)): ApiPath<(String, String)>,
) -> Result<Json<TeamMember>, ApiError> {
    let (team, role) = team_for(&state, &caller, &name).await?;
    let user_id = state.store.user_id_by_name(&user).await?;
    let own = user_id == caller.0.id;
    if !own {
        require(&team.name, role, TeamAction::ManageMembers)?;
    }
    let owners_too = own || roles::may(role, TeamAction::ManageOwners);
    let gone = state
        .store
        .remove_member(&team.id, &user_id, owners_too)
        .await
        .map_err(|e| owner_refused(e, &team.name, role))?;
    tracing::info!(team = %team.name, user = %user, by = %caller.0.id, "team member removed");
    Ok(Json(gone))
}

/// The store's refusal to touch an owner, as the 403 of the role it needs.
fn owner_refused(e: gpurent_store::StoreError, team: &str, role: TeamRole) -> ApiError {
    match e {
        gpurent_store::StoreError::OwnerUntouched => require(team, role, TeamAction::ManageOwners)
            .err()
            .unwrap_or_else(|| ApiError::Forbidden("only an owner changes an owner".into())),
        other => other.into(),
    }
}

/// Move your own credit into a team's balance (an owner of the team). With an
/// `Idempotency-Key`, a retried move is made once.
#[utoipa::path(post, path = "/api/v1/teams/{name}/credit", tag = "teams", security(("bearer" = [])),
    params(("name" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    request_body = MoveCredit,
    responses((status = 200, body = CreditMoved), (status = 402, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn move_credit(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<MoveCredit>,
) -> Result<Json<CreditMoved>, ApiError> {
    let (team, role) = team_for(&state, &caller, &name).await?;
    require(&team.name, role, TeamAction::MoveCredit)?;
    let amount = crate::validate::grant_amount(body.amount)?;
    let who = &caller.0.id;
    let transfer_id = match idempotency_key(&headers)? {
        Some(key) => format!("move:{who}:{}:key:{key}", team.id),
        None => format!(
            "move:{who}:{}:once:{}",
            team.id,
            hex::encode(rand::random::<[u8; 16]>())
        ),
    };
    let (balance, team_balance) = state
        .store
        .move_credit(who, &team.id, amount, &transfer_id, state.now())
        .await?;
    tracing::info!(team = %team.name, by = %who, %amount, "credit moved into a team");
    Ok(Json(CreditMoved {
        amount,
        balance,
        team_balance,
    }))
}
