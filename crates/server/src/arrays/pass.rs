//! The array pass, run before each scheduling pass: for every array not ended, starts its next
//! tasks up to its limit (`sched::array::to_start`), each a queued reservation under the key of
//! its array and index (two passes start it once), and moves its next index on, never back. It
//! reads the arrays before their live tasks: a pass with an old next index and a fresh count
//! starts again only tasks that exist, never more than the limit. It ends an array with nothing live and nothing left; stops what a stopped array still
//! runs. Refused tasks (credit, limits) are tried again after a wait, the reason shown on the
//! array.

use gpurent_sched::array::{self, ArraySpec};
use gpurent_store::{ArrayRow, Scope, StoreError};
use gpurent_types::api::CreateReservation;

use crate::error::ApiError;
use crate::jobs::JobError;
use crate::state::AppState;

/// How long after a refused task (credit, budget, caps) the array tries again.
const REFUSED_RETRY_S: i64 = 5;
/// How long after any other failure to start a task (a volume gone, the store failing) the
/// array tries again: the reason stays on the array meanwhile, for its tenant to act on.
const FAILED_RETRY_S: i64 = 60;
/// The most tasks one pass starts of one array (the scheduling pass waits for them); more
/// are started by the next pass, asked for at once.
const STARTS_PER_PASS: u64 = 256;
/// How long a new array is left to the request that made it (which starts its first task)
/// before passes move it on by themselves.
const CREATION_S: i64 = 60;

/// One pass over every array not ended. An array that fails is logged and skipped: the others
/// go on.
pub(crate) async fn run(state: &AppState) -> Result<(), JobError> {
    let arrays = state.store.live_arrays().await?;
    if arrays.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = arrays.iter().map(|a| a.id.clone()).collect();
    let live = state.store.array_live_tasks(&ids).await?;
    for row in &arrays {
        let n = live
            .iter()
            .find(|(id, _)| *id == row.id)
            .map_or(0, |&(_, n)| n);
        if let Err(e) = one(state, row, n).await {
            tracing::warn!(array = %row.id, error = %e, "array: its pass failed; again at the next");
        }
    }
    Ok(())
}

/// Moves one array on, with `live` of its tasks queued or running.
async fn one(state: &AppState, row: &ArrayRow, live: u64) -> Result<(), ApiError> {
    let now = state.now();
    let spec = ArraySpec {
        first: row.first,
        last: row.last,
        max_running: row.max_running,
    };
    let next = row.next_index.max(row.first);
    let nothing_left = row.stopped_at.is_some() || next > row.last;
    if nothing_left && live == 0 {
        state.store.end_array(&row.id, now).await?;
        tracing::info!(array = %row.id, "array ended");
        return Ok(());
    }
    if row.stopped_at.is_some() {
        return super::stop_live(state, row).await;
    }
    if row.retry_at.is_some_and(|at| at > now) {
        return Ok(());
    }
    // Its first task is its request's to start: a refusal there removes the array.
    if next == row.first && now - row.created_at < chrono::Duration::seconds(CREATION_S) {
        return Ok(());
    }
    let n = array::to_start(&spec, live, next);
    if n == 0 {
        return Ok(());
    }
    let n = if n > STARTS_PER_PASS {
        state.wake.wake_scheduler();
        STARTS_PER_PASS
    } else {
        n
    };
    let shape: CreateReservation = serde_json::from_str(&row.spec)
        .map_err(|e| ApiError::Store(StoreError::Corrupt(format!("array spec: {e}"))))?;
    let mut started = 0;
    let mut failed = None;
    for index in next..next + n {
        match start_task(state, row, &shape, index).await {
            Ok(()) => started += 1,
            Err(e) => {
                failed = Some((index, e));
                break;
            }
        }
    }
    if started > 0 {
        state.store.advance_array(&row.id, next + started).await?;
    }
    match failed {
        Some((index, e)) => {
            let wait = if refused(&e) {
                tracing::info!(array = %row.id, index, error = %e, "array: a task is refused");
                REFUSED_RETRY_S
            } else {
                tracing::warn!(array = %row.id, index, error = %e, "array: a task cannot start");
                FAILED_RETRY_S
            };
            let why = format!("task {index} cannot start: {e}");
            let retry = now + chrono::Duration::seconds(wait);
            state
                .store
                .set_array_message(&row.id, Some(&why), Some(retry))
                .await?;
        }
        None if started > 0 && row.message.is_some() => {
            state.store.set_array_message(&row.id, None, None).await?;
        }
        None => {}
    }
    // A stop that came meanwhile (on another control plane, whose pass may have ended the
    // array already) stops what this pass started.
    if started > 0
        && state
            .store
            .get_array(&row.id, &Scope::All)
            .await?
            .stopped_at
            .is_some()
    {
        super::stop_live(state, row).await?;
    }
    Ok(())
}

/// A refusal that passes with time or the tenant's act (credit, budget, caps), tried again
/// soon; anything else is tried again after a minute.
fn refused(e: &ApiError) -> bool {
    matches!(
        e,
        ApiError::Store(
            StoreError::InsufficientCredit { .. }
                | StoreError::BudgetExceeded(_)
                | StoreError::LimitExceeded(_)
        )
    )
}

/// Reserves task `index` of the array: queued when nothing fits, under the key of the array
/// and the index.
pub(crate) async fn start_task(
    state: &AppState,
    row: &ArrayRow,
    shape: &CreateReservation,
    index: u64,
) -> Result<(), ApiError> {
    let card = crate::routes::reservations::card_vram_mb(state, shape).await?;
    let mut new = super::task_request(row, shape, index, card)?;
    new.limits = state.live().tenant_limits;
    (new.mounts, new.node_filter) = crate::volumes::mounts(
        state,
        &row.tenant_id,
        &shape.volumes,
        shape.checkpoint_volume.as_deref(),
    )
    .await?;
    let expected = state.expected.note(new.gpu_type.key(), new.want);
    let (reservation, nodes) = state
        .store
        .reserve(
            new,
            &state.live().prices,
            state.live_since(),
            state.now(),
            &expected,
        )
        .await?;
    for node in &nodes {
        state.wake.wake(node);
    }
    tracing::debug!(array = %row.id, index, reservation = %reservation.id, "array: task started");
    Ok(())
}
