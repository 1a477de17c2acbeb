//! How a reservation ends, billed by `gpurent_billing::ending::bill`: a final end (its instance
//! gone: the rest of its charge, its hold given back, its host paid, its GPUs freed), a run on a
//! lost or drained node billed and queued again, or a queued reservation's end.

use gpurent_billing::ending::{self, Bill, Ending, Facts};
use gpurent_billing::Rate;
use gpurent_types::agent::{InstanceReport, InstanceState, AGENT_END_REASONS};
use gpurent_types::{Money, ReservationStatus, Tier};
use sqlx::{AnyConnection, Row};

use super::ledger::{self, Kind, Transfer, PLATFORM_REVENUE};
use super::nodes::adjust_pool;
use super::restarts::{with_restart, Requeue};
use crate::Result;

/// What ended a live reservation's instance.
#[derive(Debug, Clone, Copy)]
pub(super) enum Gone<'a> {
    /// Its agent reported the instance stopped, exited or failed.
    Reported(&'a InstanceReport),
    /// Its node, or a GPU it ran on, was lost: it ends as its stop (or its expiry) said, or
    /// as lost.
    Fenced,
}

/// A reservation's row as `facts_of` reads it (`$1`: its id), with its node's owner.
const SELECT_FACTS: &str = "SELECT r.tenant_id, r.tier, r.price_per_hour, r.price_step_s,
    r.price_after, r.started_at, r.run_before_s, r.stop_requested_at, r.end_reason, r.duration_s,
    r.node_id, r.host_share_bps, r.epoch, r.restarts, n.owner_id, n.name AS node_name
    FROM reservations r LEFT JOIN nodes n ON n.id = r.node_id WHERE r.id = $1";

/// A reservation's billing facts from its row (`SELECT_FACTS`), with what its meter says so far.
fn facts_of(row: &sqlx::any::AnyRow, charged: Money, held: Money) -> Result<Facts> {
    let nonneg = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Facts {
        rate: rate_of(row)?,
        prepaid_block: row.try_get::<String, _>("tier")? == Tier::Reserved.as_str(),
        duration_s: nonneg(row.try_get("duration_s")?),
        started_at: row.try_get("started_at")?,
        run_before_s: nonneg(row.try_get("run_before_s")?),
        stop_requested_at: row.try_get("stop_requested_at")?,
        charged,
        held,
        host_share_bps: u32::try_from(row.try_get::<i64, _>("host_share_bps")?).unwrap_or(0),
    })
}

/// When reservation `id`'s billing ends if its run ended at `at` (at its stop, if one was
/// asked for; never past its hours), by `gpurent_billing::ending::end_of`.
pub(super) async fn end_at(conn: &mut AnyConnection, id: &str, at: i64) -> Result<ending::End> {
    let row = sqlx::query(SELECT_FACTS)
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    Ok(ending::end_of(
        &facts_of(&row, Money::ZERO, Money::ZERO)?,
        at,
    ))
}

/// A reservation's final status and end reason, and how its bill sees that end: its own end
/// reason when a stop gave it one (an expiry if its hours ran out first), else what its agent
/// reported.
fn classify(
    end_reason: Option<String>,
    past_hours: bool,
    gone: Gone<'_>,
) -> (ReservationStatus, String, Ending) {
    use ReservationStatus as S;
    let end_reason = if past_hours {
        Some("expired".to_owned())
    } else {
        end_reason
    };
    if let Some(r) = end_reason {
        return match r.as_str() {
            "expired" => (S::Expired, r, Ending::Expired),
            PREEMPTED => (S::Preempted, r, Ending::Preempted),
            NODE_LOST => (S::Lost, r, Ending::NodeLost),
            // Its agent stopped it for a reason of its own (`agent_events::stopping`).
            a if AGENT_END_REASONS.contains(&a) => (S::Failed, r, Ending::AgentStopped),
            _ => (S::Stopped, r, Ending::Stopped),
        };
    }
    let report = match gone {
        Gone::Reported(report) => report,
        // Fencing names every end it makes; one without a reason was lost with its node.
        Gone::Fenced => return (S::Lost, NODE_LOST.to_owned(), Ending::NodeLost),
    };
    match (report.end_reason.as_deref(), report.state) {
        // The agent ended it for a reason of its own (over its GPU memory past the grace).
        (Some(r), _) if AGENT_END_REASONS.contains(&r) => {
            (S::Failed, r.to_owned(), Ending::AgentStopped)
        }
        (_, InstanceState::Exited) if report.exit_code == Some(0) => {
            (S::Stopped, "exited".to_owned(), Ending::Exited)
        }
        (_, InstanceState::Exited) => (S::Failed, "exited_with_error".to_owned(), Ending::Exited),
        (_, InstanceState::Failed) => (
            S::Failed,
            "failed_to_start".to_owned(),
            Ending::FailedToStart,
        ),
        _ => (
            S::Stopped,
            "stopped_by_agent".to_owned(),
            Ending::StoppedByAgent,
        ),
    }
}

/// Ends a reservation whose instance is gone: its final status, and its bill
/// (`gpurent_billing::ending::bill`) paid: the rest of its charge (transfer id
/// `charge:<id>:final`, so at most once), what it still held given back (`release:<id>`), its
/// host's share (`earn:<id>:final`); and its GPUs freed.
pub(super) async fn finish(
    conn: &mut AnyConnection,
    id: &str,
    from: ReservationStatus,
    gone: Gone<'_>,
    now: i64,
) -> Result<bool> {
    let row = sqlx::query(SELECT_FACTS)
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    let tenant_id: String = row.try_get("tenant_id")?;
    let node_id: Option<String> = row.try_get("node_id")?;
    let owner: Option<String> = row.try_get("owner_id")?;
    // Its times alone say when billing ended, and whether its hours ran out first.
    let end = ending::end_of(&facts_of(&row, Money::ZERO, Money::ZERO)?, now);
    let (status, reason, how) = classify(row.try_get("end_reason")?, end.past_hours, gone);

    // The status compare-and-set: only one ending wins.
    // A failure says why where its tenant looks: `get`, and the log.
    let message = match gone {
        Gone::Reported(report) => end_message(status, report),
        Gone::Fenced => None,
    };
    let ended = sqlx::query(
        "UPDATE reservations SET status = $1, ended_at = $2, end_reason = $3, end_message = $4
         WHERE id = $5 AND status = $6",
    )
    .bind(status.as_str())
    .bind(end.at)
    .bind(&reason)
    .bind(&message)
    .bind(id)
    .bind(from.as_str())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if ended != 1 {
        return Ok(false);
    }
    if let Some(message) = &message {
        super::logs::note(conn, id, &format!("{reason}: {message}")).await?;
    }
    // The GPUs before the money, in the order a placement locks them (its node's pool, then
    // its tenant's accounts): the other order deadlocks with a reservation of the same tenant
    // placed on the same node meanwhile.
    release_gpus(conn, id).await?;
    // Closing the meter locks it and reads it under that lock, so a settlement that committed
    // meanwhile is seen, and one that read it before cannot update it any more.
    let (charged, held) = close_meter(conn, id).await?;
    let bill = ending::bill(&facts_of(&row, charged, held)?, how, now);
    write_meter(conn, id, &bill).await?;
    pay(
        conn,
        &Payment {
            id,
            tenant_id: &tenant_id,
            tag: "final",
            owner: owner.as_deref(),
            node_id: None,
            earned_on: node_id.as_deref(),
            at: now,
        },
        &bill,
    )
    .await?;
    tracing::info!(reservation_id = id, status = %status, seconds = bill.seconds, charged = %bill.charged, "reservation ended");
    Ok(true)
}

/// Writes what `bill` leaves on the reservation's meter: charged in all, and still held.
async fn write_meter(conn: &mut AnyConnection, id: &str, bill: &Bill) -> Result<()> {
    sqlx::query("UPDATE meters SET charged = $1, held = $2 WHERE reservation_id = $3")
        .bind(bill.charged.micros())
        .bind(bill.held.micros())
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Locks a reservation's meter and stops its settlement; what it has charged and holds.
async fn close_meter(conn: &mut AnyConnection, id: &str) -> Result<(Money, Money)> {
    let meter = sqlx::query(
        "UPDATE meters SET settled_until = NULL WHERE reservation_id = $1 RETURNING charged, held",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    Ok((
        Money::from_micros(meter.try_get("charged")?),
        Money::from_micros(meter.try_get("held")?),
    ))
}

/// Whose a bill's transfers are and how they are named.
struct Payment<'a> {
    id: &'a str,
    tenant_id: &'a str,
    /// The transfers' ids: `release:<id>` (a final end), `charge:<id>:<tag>` and
    /// `earn:<id>:<tag>`.
    tag: &'a str,
    /// The node's owner, paid its share.
    owner: Option<&'a str>,
    /// The node the charge transfer names (none for a final end, as always).
    node_id: Option<&'a str>,
    /// The node the earning transfer names.
    earned_on: Option<&'a str>,
    at: i64,
}

/// Moves a bill's money: the hold given back, the charge (a block's out of its hold, any excess
/// and everything else out of the balance), the host's share. Each transfer has its own id,
/// so paying a bill twice moves nothing more.
async fn pay(conn: &mut AnyConnection, p: &Payment<'_>, bill: &ending::Bill) -> Result<()> {
    let (user, hold) = (
        ledger::user_account(p.tenant_id),
        ledger::hold_account(p.tenant_id),
    );
    let id = p.id;
    let tag = p.tag;
    // A block's charge is the main one; only what its hold could not cover comes apart.
    let (main_from, main, extra) = if bill.from_hold > Money::ZERO {
        (&hold, bill.from_hold, bill.from_balance)
    } else {
        (&user, bill.from_balance, Money::ZERO)
    };
    let moves = [
        (
            format!("release:{id}"),
            &hold,
            &user,
            bill.released,
            Kind::Release,
            None,
        ),
        (
            format!("charge:{id}:{tag}"),
            main_from,
            &PLATFORM_REVENUE.to_owned(),
            main,
            Kind::Charge,
            p.node_id,
        ),
        (
            format!("charge:{id}:{tag}:balance"),
            &user,
            &PLATFORM_REVENUE.to_owned(),
            extra,
            Kind::Charge,
            p.node_id,
        ),
    ];
    for (transfer_id, debit, credit, amount, kind, node_id) in &moves {
        ledger::transfer(
            conn,
            Transfer {
                id: transfer_id,
                debit,
                credit,
                amount: amount.micros(),
                reservation_id: Some(id),
                at: p.at,
                kind: *kind,
                node_id: *node_id,
                volume_id: None,
            },
        )
        .await?;
    }
    if let Some(owner) = p.owner {
        ledger::pay_host_share(
            conn,
            &format!("earn:{id}:{tag}"),
            owner,
            p.earned_on,
            id,
            bill.earned,
            p.at,
        )
        .await?;
    }
    Ok(())
}

/// Queues a reservation of a lost node (or a drained one, or a managed job's run that ended)
/// again, its restart listed (`requeue`): its run is billed to `fence_at` as
/// `gpurent_billing::ending::Ending::Requeued` (the exact charge for the whole seconds it ran,
/// under `charge:<id>:lost:<epoch>`, and its host's share under `earn:<id>:lost:<epoch>`, so at
/// most once per epoch), its GPU memory is given back, and it waits as `pending` with no node
/// and the next epoch. What it still holds stays held; its billing restarts when it runs
/// again, from where it stopped (`run_before_s`). False when its status changed meanwhile.
pub(super) async fn requeue_lost(
    conn: &mut AnyConnection,
    id: &str,
    from: ReservationStatus,
    fence_at: i64,
    now: i64,
    requeue: &Requeue<'_>,
) -> Result<bool> {
    let row = sqlx::query(SELECT_FACTS)
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    let tenant_id: String = row.try_get("tenant_id")?;
    let node_id: Option<String> = row.try_get("node_id")?;
    let share_bps: i64 = row.try_get("host_share_bps")?;
    let epoch: i64 = row.try_get("epoch")?;
    let owner: Option<String> = row.try_get("owner_id")?;
    // Whole seconds run in all, counted from its effective start; never past its hours.
    let ran_s = ending::end_of(&facts_of(&row, Money::ZERO, Money::ZERO)?, fence_at).ran_s;
    // This run's own start: the effective one is moved back by the runs before it.
    let run_before_s: i64 = row.try_get("run_before_s")?;
    let run_started = row
        .try_get::<Option<i64>, _>("started_at")?
        .map(|s| s.saturating_add(run_before_s.saturating_mul(1_000_000)));
    let restarts = with_restart(
        &row.try_get::<String, _>("restarts")?,
        requeue,
        epoch,
        row.try_get("node_name")?,
        run_started,
        fence_at,
    )?;
    let claimed = sqlx::query(
        "UPDATE reservations SET status = 'pending', node_id = NULL, gpus = '[]', epoch = epoch + 1,
            log_read = 0, log_cut = NULL, log_tail = NULL, queued_at = $1, placed_at = NULL, started_at = NULL, run_before_s = $2,
            published = '[]', queue_reason = $5, end_reason = NULL, stop_requested_at = NULL,
            stop_grace_s = NULL, retry_at = $6, restarts_counted = restarts_counted + $7,
            restarts = $8
         WHERE id = $3 AND status = $4",
    )
    .bind(now)
    .bind(i64::try_from(ran_s).unwrap_or(i64::MAX))
    .bind(id)
    .bind(from.as_str())
    .bind(requeue.reason)
    .bind(requeue.retry_at)
    .bind(i64::from(requeue.counted))
    .bind(restarts)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if claimed != 1 {
        return Ok(false);
    }
    // The GPUs before the money (see `finish`).
    release_gpus(conn, id).await?;
    // Closing the meter locks it (see `finish`); it is opened again when the reservation runs.
    let (charged, held) = close_meter(conn, id).await?;
    let base: i64 = sqlx::query_scalar("SELECT base_charged FROM meters WHERE reservation_id = $1")
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    let bill = ending::bill(&facts_of(&row, charged, held)?, Ending::Requeued, fence_at);
    sqlx::query(
        "UPDATE meters SET charged = $1, held = $2, base_charged = $1, node_id = NULL
         WHERE reservation_id = $3",
    )
    .bind(bill.charged.micros())
    .bind(bill.held.micros())
    .bind(id)
    .execute(&mut *conn)
    .await?;
    let tag = format!("lost:{epoch}");
    pay(
        conn,
        &Payment {
            id,
            tenant_id: &tenant_id,
            tag: &tag,
            // Its host is paid for a run on a node it still owns.
            owner: owner.as_deref().filter(|_| node_id.is_some()),
            node_id: None,
            earned_on: node_id.as_deref(),
            at: fence_at,
        },
        &bill,
    )
    .await?;
    if let (Some(_), Some(node)) = (&owner, &node_id) {
        sqlx::query(
            "INSERT INTO lost_runs (reservation_id, epoch, node_id, charged_from, charged_to,
                host_share_bps, lost_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(id)
        .bind(epoch)
        .bind(node)
        .bind(base)
        .bind(bill.charged.micros())
        .bind(share_bps)
        .bind(fence_at)
        .execute(&mut *conn)
        .await?;
    }
    tracing::info!(reservation_id = id, node_id = ?node_id, epoch = epoch + 1, ran_s, charged = %bill.charged, cause = requeue.cause, "reservation queued again");
    Ok(true)
}

/// Bills the end of a reservation that ended while queued (`end_queued`), its status already
/// set: its meter closed and its hold given back, nothing more charged.
pub(super) async fn end_unplaced(
    conn: &mut AnyConnection,
    id: &str,
    tenant_id: &str,
    now: i64,
) -> Result<()> {
    let row = sqlx::query(SELECT_FACTS)
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    let (charged, held) = close_meter(conn, id).await?;
    let bill = ending::bill(&facts_of(&row, charged, held)?, Ending::Unplaced, now);
    write_meter(conn, id, &bill).await?;
    pay(
        conn,
        &Payment {
            id,
            tenant_id,
            tag: "final",
            owner: None,
            node_id: None,
            earned_on: None,
            at: now,
        },
        &bill,
    )
    .await
}

/// The reservation's charge rate from its price columns.
fn rate_of(row: &sqlx::any::AnyRow) -> Result<Rate> {
    let first = Money::from_micros(row.try_get("price_per_hour")?);
    let step: Option<i64> = row.try_get("price_step_s")?;
    let after: Option<i64> = row.try_get("price_after")?;
    Ok(match (step, after) {
        (Some(step), Some(after)) => Rate {
            first,
            step_s: u64::try_from(step).unwrap_or(0),
            then: Money::from_micros(after),
        },
        _ => Rate::flat(first),
    })
}

/// Gives a reservation's GPU memory back.
pub(crate) async fn release_gpus(conn: &mut AnyConnection, reservation_id: &str) -> Result<()> {
    super::quota_use::release(conn, reservation_id).await?;
    let allocations =
        sqlx::query("SELECT gpu_uuid, vram_mb FROM allocations WHERE reservation_id = $1")
            .bind(reservation_id)
            .fetch_all(&mut *conn)
            .await?;
    for a in allocations {
        let uuid: String = a.try_get("gpu_uuid")?;
        let mb: i64 = a.try_get("vram_mb")?;
        // A missing GPU has none free until its agent reports it again.
        let row = sqlx::query(
            "UPDATE gpus SET free_mb = free_mb + $1 WHERE uuid = $2 AND missing_since IS NULL
             RETURNING node_id, type_key, vram_mb - free_mb AS used",
        )
        .bind(mb)
        .bind(&uuid)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else { continue };
        if row.try_get::<i64, _>("used")? == 0 {
            let node_id: String = row.try_get("node_id")?;
            let type_key: String = row.try_get("type_key")?;
            adjust_pool(conn, &node_id, &type_key, 1).await?;
        }
    }
    sqlx::query("DELETE FROM allocations WHERE reservation_id = $1")
        .bind(reservation_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The end reason of a spot reservation preempted (`queue::preempt_reservation`).
pub(crate) const PREEMPTED: &str = "preempted";

/// The end reason of a reservation whose node was lost and whose tenant chose `stop`.
pub(crate) const NODE_LOST: &str = "node_lost";

/// The most of an executor's message a reservation keeps (`end_message`), in characters.
pub(crate) const END_MESSAGE_MAX_CHARS: usize = 1000;

/// What a failed instance's report said, for its tenant: kept when the instance failed (to
/// start, or exited with an error) and its agent said why, at most `END_MESSAGE_MAX_CHARS`.
pub(super) fn end_message(status: ReservationStatus, report: &InstanceReport) -> Option<String> {
    if status != ReservationStatus::Failed {
        return None;
    }
    let message = report.message.as_deref()?.trim();
    if message.is_empty() {
        return None;
    }
    Some(match message.char_indices().nth(END_MESSAGE_MAX_CHARS) {
        Some((cut, _)) => format!("{}...", &message[..cut]),
        None => message.to_owned(),
    })
}
