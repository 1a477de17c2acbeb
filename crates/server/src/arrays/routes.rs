//! The arrays' own routes: the caller's arrays, and one array's tasks by index.

use axum::extract::State;
use axum::Json;
use gpurent_types::api::{ErrorBody, Reservation};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

/// The caller's job arrays (`array`), newest first, at most 200, each as one reservation: its
/// tasks counted under `array`, their charges together. Their tasks are not in
/// `GET /api/v1/reservations`; `GET /api/v1/reservations/{id}/tasks` lists them.
#[utoipa::path(get, path = "/api/v1/arrays", tag = "reservations", security(("bearer" = [])),
    responses((status = 200, body = [Reservation]), (status = 401, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<Reservation>>, ApiError> {
    Ok(Json(super::list(&state, &caller.scope()).await?))
}

/// Which of an array's tasks `GET .../tasks` returns.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct TasksQuery {
    /// The first index to return.
    #[serde(default)]
    #[param(required = false)]
    from: u64,
    /// At most this many (1 to 1000, 100 by default).
    #[serde(default)]
    #[param(required = false, minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Only the tasks queued or running.
    #[serde(default)]
    #[param(required = false)]
    live: bool,
}

/// A job array's tasks that started, by index from `from`: each a reservation of its own
/// (`ID[INDEX]` names one in the other reservation routes). Another tenant's array is
/// reported as not found.
#[utoipa::path(get, path = "/api/v1/reservations/{id}/tasks", tag = "reservations",
    security(("bearer" = [])), params(("id" = String, Path), TasksQuery),
    responses((status = 200, body = [Reservation]), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn tasks(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<TasksQuery>,
) -> Result<Json<Vec<Reservation>>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::Invalid("limit must be from 1 to 1000".to_owned()));
    }
    let row = state.store.get_array(&id, &caller.scope()).await?;
    Ok(Json(
        state
            .store
            .list_array_tasks(&row.id, query.from, limit, query.live)
            .await?,
    ))
}
