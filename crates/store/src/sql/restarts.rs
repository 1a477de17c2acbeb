//! Managed jobs (`--restart`): a run that ended is billed and queued again, or ends the job, as
//! its restart policy decides (`gpurent_sched::restart`); what each restart is recorded as.

use gpurent_sched::restart::{decide, Decision, RunEnd};
use gpurent_types::agent::{InstanceState, AGENT_END_REASONS};
use gpurent_types::api::Restart;
use gpurent_types::{ReservationStatus, RestartPolicy};
use sqlx::{AnyConnection, Row};

use super::endings::{end_at, end_message, finish, requeue_lost, Gone, NODE_LOST, PREEMPTED};
use super::from_ts;
use crate::{Result, StoreError};

/// The most restarts a reservation lists (the oldest go first); its epoch still counts them all.
const RESTARTS_KEPT: usize = 100;

/// How a run that ends is queued again: why it waits (`queue_reason`), the restart's cause
/// and message as its list shows them, whether it counts against `max_restarts`, and when it
/// may be placed.
#[derive(Debug, Clone)]
pub(super) struct Requeue<'a> {
    pub reason: &'a str,
    pub cause: &'a str,
    pub message: Option<String>,
    pub counted: bool,
    pub retry_at: Option<i64>,
}

impl<'a> Requeue<'a> {
    /// A run moved off its node (lost, drained, a GPU gone): placed again at once.
    pub(super) fn moved(cause: &'a str, reason: &'a str) -> Self {
        Requeue {
            reason,
            cause,
            message: None,
            counted: false,
            retry_at: None,
        }
    }
}

/// A reservation row's restart policy (`restart_policy`).
pub(super) fn policy_of(row: &sqlx::any::AnyRow) -> Result<RestartPolicy> {
    row.try_get::<String, _>("restart_policy")?
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("{e}")))
}

/// A run of reservation `id` (restart policy `policy`, as its caller read it) ended at `now`
/// (its agent's report, or a stop finished as its node was fenced): queued again when it is a
/// managed job whose policy restarts such an end, else finished (`finish`). False when its
/// status changed meanwhile.
pub(super) async fn run_ended(
    conn: &mut AnyConnection,
    id: &str,
    from: ReservationStatus,
    policy: RestartPolicy,
    gone: Gone<'_>,
    now: i64,
) -> Result<bool> {
    if policy == RestartPolicy::Never {
        return finish(conn, id, from, gone, now).await;
    }
    let row = sqlx::query(
        "SELECT max_restarts, restarts_counted, end_reason FROM reservations WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let count = |col: &str| -> Result<u32> {
        Ok(u32::try_from(row.try_get::<i64, _>(col)?).unwrap_or(u32::MAX))
    };
    // When billing ends (at a stop asked for, a preemption's included) and whether its hours
    // ran out first: the one ending rule's answer.
    let end = end_at(conn, id, now).await?;
    let end_reason: Option<String> = row.try_get("end_reason")?;
    let (end_as, cause) = run_end(end_reason.as_deref(), end.past_hours, gone);
    let (wait_s, counted) = match decide(
        policy,
        count("max_restarts")?,
        count("restarts_counted")?,
        end_as,
    ) {
        Decision::End => return finish(conn, id, from, gone, now).await,
        Decision::Restart { wait_s, counted } => (wait_s, counted),
    };
    let message = match gone {
        Gone::Reported(report) => end_message(ReservationStatus::Failed, report),
        Gone::Fenced => None,
    };
    let retry_at =
        (wait_s > 0).then(|| now.saturating_add(i64::try_from(wait_s).unwrap_or(0) * 1_000_000));
    let until = retry_at
        .map(|at| from_ts(at).map(|t| t.format("%H:%M:%S UTC").to_string()))
        .transpose()?;
    let reason = match &until {
        Some(until) => format!("restarting after {cause}: waits until {until} (back-off)"),
        None => format!("restarting after {cause}; waiting to run again"),
    };
    let requeue = Requeue {
        reason: &reason,
        cause: &cause,
        message: message.clone(),
        counted,
        retry_at,
    };
    if !requeue_lost(conn, id, from, end.at, now, &requeue).await? {
        return Ok(false);
    }
    // The log says what ended the run, then when the next one comes.
    let said = message.map(|m| format!(": {m}")).unwrap_or_default();
    let next = match &until {
        Some(until) => format!("it runs again after a back-off, not before {until}"),
        None => "it runs again as soon as it is placed".to_owned(),
    };
    super::logs::note(conn, id, &format!("{cause}{said}; {next}")).await?;
    Ok(true)
}

/// How a restart policy sees a run's end, and the cause its restart is listed with: the end
/// reason a stop gave it (an expiry if its hours ran out first), else what its agent reported.
fn run_end(end_reason: Option<&str>, past_hours: bool, gone: Gone<'_>) -> (RunEnd, String) {
    if past_hours {
        return (RunEnd::Stopped, "expired".to_owned());
    }
    if let Some(r) = end_reason {
        let end = match r {
            PREEMPTED | NODE_LOST => RunEnd::Interrupted,
            a if AGENT_END_REASONS.contains(&a) => RunEnd::Failed,
            // Its tenant, its credit or budget, idleness: the job's end.
            _ => RunEnd::Stopped,
        };
        return (end, r.to_owned());
    }
    let report = match gone {
        Gone::Reported(report) => report,
        Gone::Fenced => return (RunEnd::Interrupted, NODE_LOST.to_owned()),
    };
    let (end, cause) = match (report.end_reason.as_deref(), report.state) {
        (Some(r), _) if AGENT_END_REASONS.contains(&r) => (RunEnd::Failed, r),
        (_, InstanceState::Exited) if report.exit_code == Some(0) => (RunEnd::Succeeded, "exited"),
        (_, InstanceState::Exited) => (RunEnd::Failed, "exited_with_error"),
        (_, InstanceState::Failed) => (RunEnd::Failed, "failed_to_start"),
        // Its agent stopped it unasked (an agent's restart found it gone): not the job's doing.
        _ => (RunEnd::Interrupted, "stopped_by_agent"),
    };
    (end, cause.to_owned())
}

/// A reservation's restart list with the run that just ended added (`restarts`: the list as
/// its row keeps it; `started_at`: the run's own start, not the effective one).
pub(super) fn with_restart(
    restarts: &str,
    requeue: &Requeue<'_>,
    epoch: i64,
    node: Option<String>,
    started_at: Option<i64>,
    at: i64,
) -> Result<String> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    let mut list: Vec<Restart> = serde_json::from_str(restarts).map_err(corrupt)?;
    list.push(Restart {
        cause: requeue.cause.to_owned(),
        at: from_ts(at)?,
        epoch,
        node,
        started_at: started_at.map(from_ts).transpose()?,
        message: requeue.message.clone(),
        counted: requeue.counted,
    });
    let over = list.len().saturating_sub(RESTARTS_KEPT);
    list.drain(..over);
    serde_json::to_string(&list).map_err(corrupt)
}
