//! Job arrays (`--array 0-999%50`): one id for tasks of one shape, each a reservation with
//! `GPURENT_ARRAY_INDEX`, started by the array pass (`pass.rs`) as others end, at most the
//! array's limit queued or running at once. Here: making one, the array as one reservation
//! (its tasks counted), `ID[INDEX]` for a task, and stopping it.

pub(crate) mod pass;
pub(crate) mod routes;

use gpurent_sched::array::{self, ArraySpec, ArrayState, Tally};
use gpurent_store::{ArrayRow, ArrayTasks, NewArray, NewReservation, Scope};
use gpurent_types::api::{ArraySummary, CreateReservation, Reservation, ReservationStopped};
use gpurent_types::ReservationStatus;

use crate::error::ApiError;
use crate::state::AppState;

/// Most arrays `GET /api/v1/arrays` lists.
pub(crate) const LIST_LIMIT: u32 = 200;

/// The `array` field of a request, checked.
pub(crate) fn spec(body: &CreateReservation) -> Result<Option<ArraySpec>, ApiError> {
    body.array
        .as_deref()
        .map(|s| {
            s.parse::<ArraySpec>()
                .map_err(|e| ApiError::Invalid(format!("array: {e}")))
        })
        .transpose()
}

/// Makes the array of `body` (checked into `new` by the caller, secrets sealed) for `new`'s
/// tenant, and starts its first task at once: a request the first task cannot make (credit,
/// limits) is refused as a reservation would be, and no array is left. The rest start with the
/// array pass.
pub(crate) async fn create(
    state: &AppState,
    body: &CreateReservation,
    spec: ArraySpec,
    new: NewReservation,
) -> Result<Reservation, ApiError> {
    let shape = CreateReservation {
        // Never kept in clear: the sealed secrets go with the array.
        secrets: body
            .secrets
            .keys()
            .map(|k| (k.clone(), String::new()))
            .collect(),
        array: None,
        template: None,
        team: None,
        queue: true,
        ..body.clone()
    };
    let row = state
        .store
        .create_array(
            NewArray {
                tenant_id: new.tenant_id.clone(),
                created_by: new.created_by.clone(),
                spec: serde_json::to_string(&shape)
                    .map_err(|e| ApiError::Internal(format!("array spec: {e}")))?,
                sealed_secrets: new.sealed_secrets.clone(),
                idempotency_key: new.idempotency_key.clone(),
                request_hash: new.request_hash.clone(),
                first: spec.first,
                last: spec.last,
                max_running: spec.max_running,
            },
            state.now(),
        )
        .await?;
    if row.next_index == row.first {
        if let Err(e) = pass::start_task(state, &row, &shape, row.first).await {
            state.store.forget_array(&row.id).await?;
            return Err(e);
        }
        state.store.advance_array(&row.id, row.first + 1).await?;
    }
    state.wake.wake_scheduler();
    let scope = Scope::Tenant(row.tenant_id.clone());
    one(state, &row.id, &scope).await
}

/// `ID[INDEX]`: the task's reservation id; any other id as it is.
pub(crate) async fn task_id(
    state: &AppState,
    id: String,
    scope: &Scope,
) -> Result<String, ApiError> {
    let Some((array, index)) = id
        .strip_suffix(']')
        .and_then(|rest| rest.split_once('['))
        .and_then(|(array, index)| Some((array, index.parse::<u64>().ok()?)))
    else {
        return Ok(id);
    };
    Ok(state.store.array_task_id(array, index, scope).await?)
}

/// The array `id` as one reservation (`NotFound` for none in scope).
pub(crate) async fn one(
    state: &AppState,
    id: &str,
    scope: &Scope,
) -> Result<Reservation, ApiError> {
    let row = state.store.get_array(id, scope).await?;
    views(state, vec![row])
        .await?
        .pop()
        .ok_or_else(|| ApiError::Store(gpurent_store::StoreError::not_found("array", id)))
}

/// The caller's arrays, newest first, each as one reservation.
pub(crate) async fn list(state: &AppState, scope: &Scope) -> Result<Vec<Reservation>, ApiError> {
    let rows = state.store.list_arrays(scope, LIST_LIMIT).await?;
    views(state, rows).await
}

/// Each array as one reservation: its first task's shape and price, its tasks counted, their
/// charges together. An array whose first task is not started yet (its request in flight) is
/// not shown.
async fn views(state: &AppState, rows: Vec<ArrayRow>) -> Result<Vec<Reservation>, ApiError> {
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let tallies = state.store.array_tasks(&ids).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(first) = state
            .store
            .list_array_tasks(&row.id, row.first, 1, false)
            .await?
            .pop()
        else {
            continue;
        };
        let tasks = tallies
            .iter()
            .find(|(id, _)| *id == row.id)
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        out.push(view(&row, first, &tasks));
    }
    Ok(out)
}

/// The array as one reservation, from its first task.
fn view(row: &ArrayRow, first: Reservation, tasks: &ArrayTasks) -> Reservation {
    let spec = ArraySpec {
        first: row.first,
        last: row.last,
        max_running: row.max_running,
    };
    let unstarted = (row.last + 1).saturating_sub(row.next_index.max(row.first));
    let tally = Tally {
        done: tasks.done,
        failed: tasks.failed,
        stopped: tasks.stopped,
        running: tasks.running,
        queued: tasks.queued,
    };
    let stopped = row.stopped_at.is_some();
    let state = array::state(&tally, unstarted, stopped);
    let (status, end_reason) = match state {
        ArrayState::Queued => (ReservationStatus::Pending, None),
        ArrayState::Running => (ReservationStatus::Running, None),
        ArrayState::Done => (ReservationStatus::Stopped, Some("exited")),
        ArrayState::Failed => (ReservationStatus::Failed, Some("tasks_failed")),
        ArrayState::Stopped => (ReservationStatus::Stopped, Some("stopped_by_user")),
    };
    let ended = matches!(
        state,
        ArrayState::Done | ArrayState::Failed | ArrayState::Stopped
    );
    let summary = ArraySummary {
        spec: spec.to_string(),
        tasks: spec.len(),
        done: tally.done,
        running: tally.running,
        failed: tally.failed,
        stopped: tally.stopped + if stopped { unstarted } else { 0 },
        queued: tally.queued + if stopped { 0 } else { unstarted },
        message: row.message.clone(),
    };
    Reservation {
        id: row.id.clone(),
        status,
        node: None,
        gpus: Vec::new(),
        ports: Vec::new(),
        created_at: row.created_at,
        started_at: tasks.first_started,
        ended_at: if ended {
            tasks.last_ended.or(row.stopped_at)
        } else {
            None
        },
        end_reason: end_reason.map(str::to_owned),
        end_message: (state == ArrayState::Failed)
            .then(|| format!("{} of its {} tasks failed", summary.failed, summary.tasks)),
        charged: tasks.charged,
        held: tasks.held,
        queue_reason: None,
        waited_s: None,
        epoch: 1,
        restarts: Vec::new(),
        retry_at: None,
        disk: None,
        pull: None,
        http: Vec::new(),
        ssh: None,
        array: Some(summary),
        array_id: None,
        array_index: None,
        ..first
    }
}

/// Stops the array: no task starts after, and each live task is stopped.
pub(crate) async fn stop(
    state: &AppState,
    id: &str,
    scope: &Scope,
) -> Result<ReservationStopped, ApiError> {
    let row = state.store.stop_array(id, scope, state.now()).await?;
    stop_live(state, &row).await?;
    state.wake.wake_scheduler();
    let view = one(state, id, scope).await?;
    tracing::info!(array = %id, "array stopped");
    Ok(ReservationStopped {
        id: view.id,
        status: view.status,
    })
}

/// Stops each of the array's live tasks that no stop reached yet, a page at a time.
pub(crate) async fn stop_live(state: &AppState, row: &ArrayRow) -> Result<(), ApiError> {
    let mut from = row.first;
    loop {
        let live = state
            .store
            .list_array_tasks(&row.id, from, 500, true)
            .await?;
        let Some(last) = live.last().and_then(|r| r.array_index) else {
            return Ok(());
        };
        for task in live
            .iter()
            .filter(|t| t.status != ReservationStatus::Stopping)
        {
            let (_, node) = state
                .store
                .request_stop(&task.id, &Scope::All, state.now())
                .await?;
            if let Some(node) = node {
                state.wake.wake(&node);
            }
        }
        from = last + 1;
    }
}

/// The request `body` for task `index` of an array: its shape, checked again for `tenant`.
pub(crate) fn task_request(
    row: &ArrayRow,
    shape: &CreateReservation,
    index: u64,
    card_vram_mb: Option<u64>,
) -> Result<NewReservation, ApiError> {
    // A key no client can send (theirs are printable ASCII without spaces): a task's key is
    // never taken by another request.
    let key = format!("array task {} {index}", row.id);
    let mut new = crate::validate::reservation(&row.tenant_id, shape, Some(key), card_vram_mb)?;
    new.created_by = row.created_by.clone();
    new.sealed_secrets = row.sealed_secrets.clone();
    new.array_of = Some((row.id.clone(), index));
    Ok(new)
}
