//! What happened to nodes, in order: health breaches and recoveries (`gpurent events`).

use axum::extract::State;
use axum::Json;
use gpurent_types::api::{ErrorBody, Event};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::state::AppState;

/// Most events in one answer.
const MAX_EVENTS: u32 = 1000;

/// Where `GET /events` resumes.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
pub(crate) struct EventsQuery {
    /// The last event id seen (0, the default: from the first).
    #[serde(default)]
    after: i64,
    /// At most this many (default and cap 1000).
    limit: Option<u32>,
}

/// Events after `after`, oldest first (admin). Poll with the last id seen to follow them.
#[utoipa::path(get, path = "/api/v1/events", tag = "nodes", security(("bearer" = [])),
    params(EventsQuery),
    responses((status = 200, body = [Event]), (status = 403, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<Vec<Event>>, ApiError> {
    caller.require_admin()?;
    let limit = query.limit.unwrap_or(MAX_EVENTS).clamp(1, MAX_EVENTS);
    Ok(Json(state.store.events(query.after.max(0), limit).await?))
}
