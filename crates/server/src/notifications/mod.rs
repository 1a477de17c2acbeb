//! Notifications: the routes of `gpurent notifications` (webhooks of a user or a team, their
//! deliveries and a test), the events queued for them (`events.rs`) and their sending
//! (`deliver.rs`, to addresses `target.rs` allows). Docs: docs/notifications.md.

pub(crate) mod deliver;
pub(crate) mod events;
pub(crate) mod target;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gpurent_store::{HookRow, StoreError};
use gpurent_types::api::{
    AddNotification, ErrorBody, NotificationDelivery, NotificationHook, NOTIFICATION_EVENTS,
};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::secrets::{open_bytes, seal_bytes, SecretsError};
use crate::state::AppState;
use crate::teams::{acting_for, TeamAction};

/// Bound to every sealed webhook secret.
const PURPOSE: &[u8] = b"gpurent-notification-secret-v1";
/// Most webhooks of one user or team.
const MAX_HOOKS: usize = 10;
/// Most deliveries listed.
const DELIVERIES_SHOWN: u32 = 50;

/// The webhook secret sealed in the store, opened.
pub(crate) fn open_secret(state: &AppState, sealed: &str) -> Result<Vec<u8>, SecretsError> {
    open_bytes(&*state.config.master_key, sealed, PURPOSE)
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct HooksQuery {
    /// A team of the caller's; default: the caller.
    team: Option<String>,
}

/// The events asked for, each one known; none given: every event (`*`).
fn events_of(asked: Option<Vec<String>>) -> Result<Vec<String>, ApiError> {
    let Some(asked) = asked.filter(|a| !a.is_empty()) else {
        return Ok(vec!["*".to_owned()]);
    };
    let mut events = Vec::new();
    for e in asked {
        if e != "*" && !NOTIFICATION_EVENTS.contains(&e.as_str()) {
            return Err(ApiError::Invalid(format!(
                "{e:?} is not an event; the events are {}",
                NOTIFICATION_EVENTS.join(", ")
            )));
        }
        if !events.contains(&e) {
            events.push(e);
        }
    }
    Ok(events)
}

/// A webhook the caller may manage: theirs, or one of a team where they are an admin or
/// above; anything else is a 404, as one that does not exist.
async fn manageable(state: &AppState, caller: &Caller, id: &str) -> Result<HookRow, ApiError> {
    let not_found = || ApiError::Store(StoreError::not_found("webhook", id));
    let row = state.store.hook(id).await?.ok_or_else(not_found)?;
    let owner = &row.hook.owner_id;
    let bound = caller.1.team_id.as_ref();
    if bound.is_some_and(|team| team != owner) {
        return Err(not_found());
    }
    if *owner == caller.0.id && bound.is_none() || caller.is_admin() {
        crate::teams::own_settings_unscoped(caller, *owner == caller.0.id)?;
        return Ok(row);
    }
    let role = state.store.team_role(owner, &caller.0.id).await?;
    match role {
        Some(role) if crate::teams::roles::may(role, TeamAction::ManageNotifications) => Ok(row),
        Some(_) => Err(ApiError::Forbidden(
            "only the team's admins and owners manage its webhooks".into(),
        )),
        None => Err(not_found()),
    }
}

/// Add a webhook for your events (or a team's: its admins and owners). Its secret is in this
/// answer only: every delivery's `X-Gpurent-Signature` is `sha256=` and the hex HMAC-SHA256
/// of the body under it.
#[utoipa::path(post, path = "/api/v1/notifications", tag = "notifications",
    security(("bearer" = [])), request_body = AddNotification,
    responses((status = 201, body = NotificationHook), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn add(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<AddNotification>,
) -> Result<(StatusCode, Json<NotificationHook>), ApiError> {
    let owner = acting_for(
        &state,
        &caller,
        body.team.as_deref(),
        TeamAction::ManageNotifications,
    )
    .await?;
    crate::teams::own_settings_unscoped(&caller, owner.team.is_none())?;
    let events = events_of(body.events)?;
    let url = target::parse(&body.url).map_err(|e| ApiError::Invalid(e.to_string()))?;
    target::resolve(&url, state.config.notifications.allow_private)
        .await
        .map_err(|e| ApiError::Invalid(e.to_string()))?;
    if state.store.hooks(&owner.tenant_id).await?.len() >= MAX_HOOKS {
        return Err(ApiError::Store(StoreError::LimitExceeded(format!(
            "at most {MAX_HOOKS} webhooks each; remove one first"
        ))));
    }
    let secret = hex::encode(rand::random::<[u8; 32]>());
    let sealed = seal_bytes(&*state.config.master_key, secret.as_bytes(), PURPOSE)?;
    let hook = NotificationHook {
        id: uuid::Uuid::now_v7().to_string(),
        owner_id: owner.tenant_id.clone(),
        url: url.to_string(),
        events,
        created_at: state.now(),
        secret: None,
    };
    state
        .store
        .add_hook(&HookRow {
            hook: hook.clone(),
            secret_sealed: sealed,
            created_by: caller.0.id.clone(),
        })
        .await?;
    tracing::info!(hook = %hook.id, owner = %hook.owner_id, by = %caller.0.id, "webhook added");
    Ok((
        StatusCode::CREATED,
        Json(NotificationHook {
            secret: Some(secret),
            ..hook
        }),
    ))
}

/// Your webhooks (or a team's), without their secrets.
#[utoipa::path(get, path = "/api/v1/notifications", tag = "notifications",
    security(("bearer" = [])), params(HooksQuery),
    responses((status = 200, body = [NotificationHook]), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<HooksQuery>,
) -> Result<Json<Vec<NotificationHook>>, ApiError> {
    let owner = acting_for(
        &state,
        &caller,
        query.team.as_deref(),
        TeamAction::ManageNotifications,
    )
    .await?;
    crate::teams::own_settings_unscoped(&caller, owner.team.is_none())?;
    let hooks = state.store.hooks(&owner.tenant_id).await?;
    Ok(Json(hooks.into_iter().map(|h| h.hook).collect()))
}

/// Remove a webhook, with its deliveries.
#[utoipa::path(delete, path = "/api/v1/notifications/{id}", tag = "notifications",
    security(("bearer" = [])), params(("id" = String, Path)),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let row = manageable(&state, &caller, &id).await?;
    state.store.remove_hook(&row.hook.id).await?;
    tracing::info!(hook = %row.hook.id, by = %caller.0.id, "webhook removed");
    Ok(StatusCode::NO_CONTENT)
}

/// Send a `test` event to a webhook now; its delivery (and attempts) is in `deliveries`.
#[utoipa::path(post, path = "/api/v1/notifications/{id}/test", tag = "notifications",
    security(("bearer" = [])), params(("id" = String, Path)),
    responses((status = 202, body = NotificationDelivery), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn test(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<(StatusCode, Json<NotificationDelivery>), ApiError> {
    let row = manageable(&state, &caller, &id).await?;
    // One test at a time: a receiver that never answers is not flooded.
    let pending = state
        .store
        .deliveries(&row.hook.id, DELIVERIES_SHOWN)
        .await?;
    if pending
        .iter()
        .any(|d| d.kind == "test" && d.state == "pending")
    {
        return Err(ApiError::Store(StoreError::Conflict(
            "a test of this webhook is still being delivered; see its deliveries".into(),
        )));
    }
    let key = format!("test:{}", uuid::Uuid::now_v7());
    let now = state.now();
    events::queue(
        &state,
        &row.hook.owner_id,
        Some(&row.hook.id),
        "test",
        &key,
        serde_json::json!({"message": "a test of this webhook", "by": caller.0.name}),
        now,
    )
    .await?;
    deliver::kick(&state);
    let delivery = state
        .store
        .deliveries(&row.hook.id, 1)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::Internal("the test delivery was not queued".into()))?;
    Ok((StatusCode::ACCEPTED, Json(delivery)))
}

/// A webhook's deliveries, newest first, each with its attempts and their answers.
#[utoipa::path(get, path = "/api/v1/notifications/{id}/deliveries", tag = "notifications",
    security(("bearer" = [])), params(("id" = String, Path)),
    responses((status = 200, body = [NotificationDelivery]), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub(crate) async fn deliveries(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Vec<NotificationDelivery>>, ApiError> {
    let row = manageable(&state, &caller, &id).await?;
    Ok(Json(
        state
            .store
            .deliveries(&row.hook.id, DELIVERIES_SHOWN)
            .await?,
    ))
}
