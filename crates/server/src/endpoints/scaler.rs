//! The endpoints' scaler: every 500 ms (50 ms while a replica starts or requests wait, and at
//! once when a request finds no replica) it reads the endpoints and their replicas, starts a
//! health watch for each new replica, and writes what this control plane carries of each. For
//! the endpoints whose lease it holds (one control plane at a time scales an endpoint) it asks
//! `sched::autoscale` what to start and stop, on the load of every control plane, and applies
//! that: a decision is written at the revision it read first; a replica to stop takes no new
//! request and is stopped once its requests in flight are done.

use std::sync::Arc;
use std::time::Duration;

use gpurent_sched::autoscale::{self, Bounds, Input, Load, Replica, ReplicaState};
use gpurent_store::{EndpointRow, EndpointStanding, ReplicaOf, ReplicaRow, StoreError};
use gpurent_types::api::{CreateReservation, EndpointState};
use gpurent_types::ReservationStatus;
use tokio::sync::watch;

use super::live::{Gone, Live};
use crate::error::ApiError;
use crate::jobs::JobError;
use crate::state::AppState;

/// How often the scaler looks when nothing is happening.
const TICK: Duration = Duration::from_millis(500);
/// How long a lease to scale an endpoint lasts, and when it is renewed (this much left).
const LEASE: Duration = Duration::from_secs(5);
const RENEW_BEFORE: Duration = Duration::from_secs(3);
/// Another control plane's load counts while this fresh.
const LOAD_FRESH: Duration = Duration::from_secs(3);
/// How long a replica to stop is given to finish its requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often while a replica starts or requests wait.
const BUSY_TICK: Duration = Duration::from_millis(50);
/// A replica not ready this long after it was asked for is given up (a failed start).
pub const START_TIMEOUT: Duration = Duration::from_secs(600);
/// Failed starts in a row after which an endpoint stops trying until it is updated.
pub const MAX_FAILURES: u32 = 5;
/// The length each replica is reserved for; the scaler replaces one that reaches it.
const REPLICA_HOURS: f64 = 720.0;
/// How long after a refused start (credit, limits) the next is tried.
const REFUSED_RETRY: Duration = Duration::from_secs(5);

/// Runs until `stopped`.
pub(crate) async fn run(state: AppState, mut stopped: watch::Receiver<bool>) {
    loop {
        let busy = match pass(&state).await {
            Ok(busy) => busy,
            Err(e) => {
                tracing::warn!(error = %e, "endpoints: the scaler's pass failed");
                false
            }
        };
        let wait = if busy { BUSY_TICK } else { TICK };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = state.endpoints.scaler.notified() => {}
            _ = stopped.changed() => return,
        }
    }
}

/// One pass over every endpoint; true when one is busy (a replica starting, requests waiting).
pub(crate) async fn pass(state: &AppState) -> Result<bool, JobError> {
    let now = state.now();
    let rows = state.store.list_endpoints(None).await?;
    if rows.is_empty() && state.endpoints.all().is_empty() {
        return Ok(false);
    }
    let since = now - chrono::Duration::seconds(60);
    let replicas = state.store.endpoint_replicas(&[], Some(since)).await?;
    // Replicas of a deleted endpoint (one started as it was removed) are stopped.
    for orphan in replicas.iter().filter(|r| {
        !r.reservation.status.is_terminal()
            && r.reservation.status != ReservationStatus::Stopping
            && !rows.iter().any(|e| e.id == r.endpoint_id)
            && !state.endpoints.is_draining(&r.reservation.id)
    }) {
        stop_replica(state, &orphan.reservation.id).await;
    }
    let gone = state.endpoints.refresh(rows, &replicas);
    let all = state.endpoints.all();
    // What this control plane serves goes on whatever a write below meets (a busy database):
    // its replicas' health is watched first, and each endpoint is scaled on its own.
    for live in &all {
        for slot in unwatched(live) {
            tokio::spawn(super::health::watch(state.clone(), Arc::clone(live), slot));
        }
    }
    if let Err(e) = write_loads(state, &all).await {
        tracing::warn!(error = %e, "endpoints: cannot write this control plane's load");
    }
    let fresh = now - chrono::Duration::from_std(LOAD_FRESH).unwrap_or_default();
    let others = state.store.endpoint_loads(&state.server_id, fresh).await?;
    let mut busy = false;
    for live in all {
        let id = live.lock().row.id.clone();
        let failed = failures_seen(&live, &id, &replicas, &gone);
        {
            let inner = live.lock();
            busy |= inner.queued > 0 || inner.slots.iter().any(|s| !s.ready);
        }
        let elsewhere = others.iter().find(|(e, _, _)| *e == id).map_or(
            Load::default(),
            |&(_, inflight, queued)| Load { inflight, queued },
        );
        let scaled = match leads(state, &live).await {
            Ok(true) => scale(state, &live, &failed, elsewhere).await,
            Ok(false) => Ok(false),
            Err(e) => Err(e),
        };
        match scaled {
            Ok(b) => busy |= b,
            Err(e) => tracing::warn!(endpoint = %id, error = %e, "endpoints: cannot scale"),
        }
    }
    Ok(busy)
}

/// Whether this control plane holds the lease to scale the endpoint, renewing it when it runs
/// low.
async fn leads(state: &AppState, live: &Live) -> Result<bool, JobError> {
    let (id, held) = {
        let inner = live.lock();
        (inner.row.id.clone(), inner.lease_until)
    };
    let left = held.map(|until| until.saturating_duration_since(std::time::Instant::now()));
    if left.is_some_and(|left| left > RENEW_BEFORE) {
        return Ok(true);
    }
    let now = state.now();
    let until = now + chrono::Duration::from_std(LEASE).unwrap_or_default();
    let taken = state
        .store
        .lease_endpoint(&id, &state.server_id, now, until)
        .await?;
    live.lock().lease_until = taken.then(|| std::time::Instant::now() + LEASE);
    Ok(taken)
}

/// Writes what this control plane carries of each endpoint where it changed, or every second
/// while it is not nothing.
async fn write_loads(state: &AppState, all: &[Arc<Live>]) -> Result<(), JobError> {
    let mut loads = Vec::new();
    for live in all {
        let mut inner = live.lock();
        let now_load = (inner.inflight(), inner.queued);
        let due = match inner.load_written {
            None => now_load != (0, 0),
            Some((i, q, at)) => {
                (i, q) != now_load || (now_load != (0, 0) && at.elapsed() >= Duration::from_secs(1))
            }
        };
        if due {
            inner.load_written = Some((now_load.0, now_load.1, std::time::Instant::now()));
            loads.push((inner.row.id.clone(), now_load.0, now_load.1));
        }
    }
    if !loads.is_empty() {
        state
            .store
            .put_endpoint_loads(&state.server_id, &loads, state.now())
            .await?;
    }
    Ok(())
}

/// The endpoint's replicas that failed before they were ready (their instance ended `failed`,
/// not stopped by the scaler, preempted or lost with its node) and were not counted yet: why,
/// for each. Those this control plane saw ready are not failures of a start.
fn failures_seen(live: &Live, id: &str, replicas: &[ReplicaRow], gone: &[Gone]) -> Vec<String> {
    let mut inner = live.lock();
    let ended: Vec<&ReplicaRow> = replicas
        .iter()
        .filter(|r| r.endpoint_id == id && r.reservation.status == ReservationStatus::Failed)
        .collect();
    // Remembered while the store still lists them (it lists a minute of ended replicas).
    inner
        .counted
        .retain(|c| ended.iter().any(|r| r.reservation.id == *c));
    let mut why = Vec::new();
    for r in ended {
        if !inner.counted.insert(r.reservation.id.clone()) {
            continue;
        }
        let seen = gone.iter().find(|g| g.reservation_id == r.reservation.id);
        if seen.is_some_and(|g| g.was_ready) {
            continue;
        }
        let health = seen
            .and_then(|g| g.last_error.as_ref())
            .map(|e| format!("; its last health check: {e}"))
            .unwrap_or_default();
        why.push(format!(
            "replica {} ended before it was ready: {}{health}",
            r.index,
            r.reservation
                .end_message
                .as_deref()
                .or(r.reservation.end_reason.as_deref())
                .unwrap_or("it failed")
        ));
    }
    why
}

/// Decides and applies for one endpoint, on this control plane's load and `elsewhere` (the
/// others'); true when it is busy.
async fn scale(
    state: &AppState,
    live: &Arc<Live>,
    failed: &[String],
    elsewhere: Load,
) -> Result<bool, JobError> {
    let now = state.now();
    let (row, replicas, load, below_since, timed_out) = {
        let mut inner = live.lock();
        let mut timed_out = Vec::new();
        for slot in &mut inner.slots {
            if !slot.ready && !slot.unhealthy && slot.seen.elapsed() > START_TIMEOUT {
                slot.unhealthy = true;
                timed_out.push(format!(
                    "replica {} was not ready within {} s{}",
                    slot.index,
                    START_TIMEOUT.as_secs(),
                    slot.last_error
                        .as_ref()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                ));
            }
        }
        let replicas: Vec<Replica> = inner
            .slots
            .iter()
            .filter(|s| !s.draining)
            .map(|s| Replica {
                index: s.index,
                generation: s.generation,
                state: if s.unhealthy {
                    ReplicaState::Unhealthy
                } else if s.ready {
                    ReplicaState::Ready
                } else {
                    ReplicaState::Starting
                },
                inflight: s.inflight,
            })
            .collect();
        let load = Load {
            inflight: inner.inflight().saturating_add(elsewhere.inflight),
            queued: inner.queued.saturating_add(elsewhere.queued),
        };
        (
            inner.row.clone(),
            replicas,
            load,
            inner.below_since,
            timed_out,
        )
    };
    let mut failures = row.failures;
    let mut message = row.message.clone();
    let mut retry_at = row.retry_at;
    for why in failed.iter().chain(&timed_out) {
        failures += 1;
        message = Some(format!("{why} (failure {failures} of {MAX_FAILURES})"));
        retry_at = Some(now + backoff(failures));
    }
    let held_back = failures >= MAX_FAILURES || retry_at.is_some_and(|at| at > now);
    let may_start = if held_back {
        0
    } else {
        row.scaling.max_replicas
    };
    let decision = autoscale::decide(&Input {
        now_s: now.timestamp(),
        bounds: Bounds {
            min: row.scaling.min_replicas,
            max: row.scaling.max_replicas,
            target_inflight: row.scaling.target_inflight,
            scale_down_after_s: row.scaling.scale_down_after_s,
        },
        load,
        replicas: &replicas,
        generation: row.generation,
        below_since,
        may_start,
    });
    live.lock().below_since = decision.below_since;
    let any_ready = replicas.iter().any(|r| r.state == ReplicaState::Ready);
    let mut state_now = if failures >= MAX_FAILURES && !any_ready {
        EndpointState::Failing
    } else if any_ready {
        EndpointState::Ready
    } else if replicas.is_empty() && decision.start == 0 {
        EndpointState::Idle
    } else {
        EndpointState::Starting
    };
    if row.state == EndpointState::OutOfCredit && retry_at.is_some_and(|at| at > now) {
        state_now = EndpointState::OutOfCredit;
    }
    if state_now == EndpointState::Ready {
        // Serving again: the failures before are forgiven.
        failures = 0;
        retry_at = None;
        message = None;
    }
    let changed = decision.start > 0
        || !decision.stop.is_empty()
        || state_now != row.state
        || failures != row.failures
        || message != row.message;
    if !changed {
        return Ok(load.queued > 0 || replicas.iter().any(|r| r.state != ReplicaState::Ready));
    }
    let mut standing = EndpointStanding {
        revision: row.revision,
        state: state_now,
        message,
        failures,
        retry_at,
    };
    // Only the control plane whose write lands at the revision it read acts.
    if !state
        .store
        .set_endpoint_standing(&row.id, &standing)
        .await?
    {
        return Ok(true);
    }
    standing.revision += 1;
    for index in &decision.stop {
        let id = live
            .lock()
            .slots
            .iter()
            .find(|s| s.index == *index)
            .map(|s| s.reservation_id.clone());
        if let Some(id) = id {
            drain(state, live, id);
        }
    }
    if decision.start > 0 {
        let mut next = state.store.last_replica_index(&row.id).await?;
        // Spread: a node with none of its replicas first.
        let mut avoid: Vec<String> = live
            .lock()
            .slots
            .iter()
            .filter(|s| !s.node.is_empty() && !s.draining)
            .map(|s| s.node.clone())
            .collect();
        for _ in 0..decision.start {
            next += 1;
            let started = start_replica(state, &row, next, avoid.clone()).await;
            if let Ok(Some(node)) = &started {
                avoid.push(node.clone());
            }
            if let Err(refused) = started {
                tracing::info!(endpoint = %row.name, why = %refused, "endpoint: a replica cannot start");
                let out_of_credit = matches!(
                    refused,
                    ApiError::Store(StoreError::InsufficientCredit { .. })
                        | ApiError::Store(StoreError::BudgetExceeded(_))
                );
                standing.state = if out_of_credit {
                    EndpointState::OutOfCredit
                } else {
                    standing.state
                };
                standing.message = Some(format!("a replica cannot start: {refused}"));
                standing.retry_at =
                    Some(now + chrono::Duration::from_std(REFUSED_RETRY).unwrap_or_default());
                state
                    .store
                    .set_endpoint_standing(&row.id, &standing)
                    .await?;
                live.changed.notify_waiters();
                break;
            }
        }
    }
    Ok(true)
}

/// Stops a replica once its requests in flight are done (from now on it takes no new one), or
/// after [`DRAIN_TIMEOUT`].
pub(crate) fn drain(state: &AppState, live: &Arc<Live>, reservation_id: String) {
    lock_draining(state).insert(reservation_id.clone());
    if let Some(slot) = live
        .lock()
        .slots
        .iter_mut()
        .find(|s| s.reservation_id == reservation_id)
    {
        slot.draining = true;
    }
    tokio::spawn(drain_then_stop(
        state.clone(),
        Arc::clone(live),
        reservation_id,
    ));
}

async fn drain_then_stop(state: AppState, live: Arc<Live>, reservation_id: String) {
    let started = std::time::Instant::now();
    loop {
        let inflight = live
            .lock()
            .slots
            .iter()
            .find(|s| s.reservation_id == reservation_id)
            .map_or(0, |s| s.inflight);
        if inflight == 0 || started.elapsed() > DRAIN_TIMEOUT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_replica(&state, &reservation_id).await;
    lock_draining(&state).remove(&reservation_id);
}

fn lock_draining(state: &AppState) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
    state
        .endpoints
        .draining
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The replicas no health watch follows yet; they are marked watched.
fn unwatched(live: &Live) -> Vec<String> {
    let mut inner = live.lock();
    inner
        .slots
        .iter_mut()
        .filter(|s| !s.watched)
        .map(|s| {
            s.watched = true;
            s.reservation_id.clone()
        })
        .collect()
}

/// 0.5, 1, 2, 4 ... seconds after failure `n` (from 1), at most 5 minutes.
fn backoff(n: u32) -> chrono::Duration {
    let ms = 500_i64.saturating_mul(1_i64 << n.saturating_sub(1).min(20));
    chrono::Duration::milliseconds(ms.min(300_000))
}

/// Reserves replica `index` of the endpoint: a reservation of its shape, on a node not among
/// `avoid_nodes` where one has room, queued when nothing fits, under an idempotency key of the
/// endpoint and the number (two control planes that start the same replica get one
/// reservation). Its node, where it was placed at once.
async fn start_replica(
    state: &AppState,
    row: &EndpointRow,
    index: u64,
    avoid_nodes: Vec<String>,
) -> Result<Option<String>, ApiError> {
    let body = replica_body(row);
    let key = format!("endpoint-{}-replica-{index}", row.id);
    let card = if body.vram_gb.is_some() {
        match gpurent_types::GpuType::parse(&body.gpu_type) {
            Ok(t) => state.store.gpu_vram_mb(&t).await?,
            Err(_) => None,
        }
    } else {
        None
    };
    let mut new = crate::validate::reservation(&row.tenant_id, &body, Some(key), card)?;
    new.limits = state.live().tenant_limits;
    new.avoid_nodes = avoid_nodes;
    new.replica_of = Some(ReplicaOf {
        endpoint_id: row.id.clone(),
        index,
        generation: row.generation,
    });
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
    if reservation.queue_reason.is_some() {
        state.wake.wake_scheduler();
    }
    tracing::info!(endpoint = %row.name, index, reservation = %reservation.id, "endpoint: replica started");
    Ok(reservation.node)
}

/// What each replica of the endpoint reserves.
pub(crate) fn replica_body(row: &EndpointRow) -> CreateReservation {
    let spec = &row.spec;
    CreateReservation {
        gpu_type: spec.gpu_type.clone(),
        gpu_count: spec.gpu_count,
        vram_gb: spec.vram_gb,
        vram_fraction: None,
        hours: REPLICA_HOURS,
        tier: Some(spec.tier),
        bid: None,
        image: spec.image.clone(),
        command: spec.command.clone(),
        env: spec.env.clone(),
        ports: Vec::new(),
        http_ports: Vec::new(),
        queue: true,
        on_node_loss: None,
        idle_reclaim: Some(false),
        checkpoint: false,
        secrets: Default::default(),
        volumes: Vec::new(),
        template: None,
        team: None,
        restart: None,
        max_restarts: None,
        checkpoint_volume: None,
        array: None,
    }
}

/// Stops a replica (the scaler's or the endpoint's removal); a failure is logged and tried again
/// by the next pass.
pub(crate) async fn stop_replica(state: &AppState, reservation_id: &str) {
    let scope = gpurent_store::Scope::All;
    match state
        .store
        .request_stop(reservation_id, &scope, state.now())
        .await
    {
        Ok((_, node)) => {
            if let Some(node) = node {
                state.wake.wake(&node);
            }
            state.wake.wake_scheduler();
            tracing::info!(reservation = %reservation_id, "endpoint: replica stopped");
        }
        Err(e) => {
            tracing::warn!(reservation = %reservation_id, error = %e, "endpoint: cannot stop a replica")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_back_off_doubling_to_five_minutes() {
        let ms = |n| backoff(n).num_milliseconds();
        assert_eq!([ms(1), ms(2), ms(3), ms(4)], [500, 1000, 2000, 4000]);
        assert_eq!(ms(10), 256_000);
        assert_eq!(ms(11), 300_000);
        assert_eq!(ms(u32::MAX), 300_000);
    }
}
