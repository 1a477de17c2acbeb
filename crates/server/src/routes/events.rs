//! What happened to nodes, in order: health breaches and recoveries (`gpurent events`).

use axum::extract::State;
use axum::Json;
use gpurent_types::api::{ErrorBody, Event};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::state::AppState;

/// Where `GET /events` resumes.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// The last event id seen (0, the default: from the first).
    #[serde(default)]
    #[param(required = false, minimum = 0)]
    after: i64,
    /// At most this many: 1 to 1000, 100 by default.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// Events after `after`, oldest first (admin). Poll with the last id seen to follow them.
#[utoipa::path(get, path = "/api/v1/events", tag = "nodes", security(("bearer" = [])),
    params(EventsQuery),
    responses((status = 200, body = [Event]), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    _caller: Caller,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<Vec<Event>>, ApiError> {
    // Its cursor is the event id, which the events carry: no `X-Next-After` needed.
    if query.after < 0 {
        return Err(ApiError::Invalid(format!(
            "after: {} is not an event id (0 or more)",
            query.after
        )));
    }
    let page = crate::pagination::PageQuery {
        limit: query.limit,
        after: None,
    }
    .page()?;
    Ok(Json(
        state.store.events(query.after.max(0), page.limit).await?,
    ))
}
