//! How a reservation ends: a final end (its instance gone: the rest of its charge, its hold given
//! back, its host paid, its GPUs freed) or a run on a lost node billed and queued again.

use gpurent_billing::Rate;
use gpurent_types::agent::{InstanceReport, InstanceState, AGENT_END_REASONS};
use gpurent_types::{Money, ReservationStatus, Tier};
use sqlx::{AnyConnection, Row};

use super::ledger::{self, Kind, Transfer, PLATFORM_REVENUE};
use super::nodes::adjust_pool;
use crate::Result;

/// Ends a reservation whose instance is gone: its final status, the rest of the exact charge
/// for the seconds it ran (transfer id `charge:<id>:final`, so at most once), what it still
/// held given back, the host's share of the charge, and its GPUs freed.
pub(super) async fn finish(
    conn: &mut AnyConnection,
    id: &str,
    from: ReservationStatus,
    report: &InstanceReport,
    now: i64,
) -> Result<bool> {
    let row = sqlx::query(
        "SELECT r.tenant_id, r.tier, r.price_per_hour, r.price_step_s, r.price_after, r.started_at,
                r.stop_requested_at, r.end_reason, r.duration_s, r.node_id,
                r.host_share_bps, n.owner_id
         FROM reservations r LEFT JOIN nodes n ON n.id = r.node_id WHERE r.id = $1",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let tenant_id: String = row.try_get("tenant_id")?;
    let tier: String = row.try_get("tier")?;
    let prepaid_block = tier == Tier::Reserved.as_str();
    let rate = rate_of(&row)?;
    let started_at: Option<i64> = row.try_get("started_at")?;
    let stop_requested_at: Option<i64> = row.try_get("stop_requested_at")?;
    let mut end_reason: Option<String> = row.try_get("end_reason")?;
    let duration_s: i64 = row.try_get("duration_s")?;
    let node_id: Option<String> = row.try_get("node_id")?;
    let share_bps: i64 = row.try_get("host_share_bps")?;
    let owner: Option<String> = row.try_get("owner_id")?;
    // Never past its hours: a workload that ended after them, before the expiry pass noticed,
    // expired.
    let deadline = started_at.map(|s| s.saturating_add(duration_s.saturating_mul(1_000_000)));
    let mut ended_at = stop_requested_at.map_or(now, |t| t.min(now));
    if let Some(deadline) = deadline.filter(|d| *d < ended_at) {
        ended_at = deadline;
        end_reason = Some("expired".to_owned());
    }

    let (status, reason) = match (&end_reason, report.state) {
        (Some(r), _) if r == "expired" => (ReservationStatus::Expired, r.clone()),
        (Some(r), _) if r == "preempted" => (ReservationStatus::Preempted, r.clone()),
        (Some(r), _) if r == NODE_LOST => (ReservationStatus::Lost, r.clone()),
        // Its agent stopped it for a reason of its own (`agent_events::stopping`).
        (Some(r), _) if AGENT_END_REASONS.contains(&r.as_str()) => {
            (ReservationStatus::Failed, r.clone())
        }
        (Some(r), _) => (ReservationStatus::Stopped, r.clone()),
        // The agent ended it for a reason of its own (over its GPU memory past the grace).
        (None, _)
            if report
                .end_reason
                .as_deref()
                .is_some_and(|r| AGENT_END_REASONS.contains(&r)) =>
        {
            (
                ReservationStatus::Failed,
                report.end_reason.clone().unwrap_or_default(),
            )
        }
        (None, InstanceState::Exited) if report.exit_code == Some(0) => {
            (ReservationStatus::Stopped, "exited".to_owned())
        }
        (None, InstanceState::Exited) => {
            (ReservationStatus::Failed, "exited_with_error".to_owned())
        }
        (None, InstanceState::Failed) => (ReservationStatus::Failed, "failed_to_start".to_owned()),
        (None, _) => (ReservationStatus::Stopped, "stopped_by_agent".to_owned()),
    };
    // Billing ends when the stop was asked for (or the time was up), not when the agent got to it.
    let seconds = started_at.map_or(0, |s| (ended_at - s).max(0) / 1_000_000);
    let seconds = u64::try_from(seconds).unwrap_or(0);

    // The status compare-and-set: only one ending wins.
    // A failure says why where its tenant looks: `get`, and the log.
    let message = end_message(status, report);
    let ended = sqlx::query(
        "UPDATE reservations SET status = $1, ended_at = $2, end_reason = $3, end_message = $4
         WHERE id = $5 AND status = $6",
    )
    .bind(status.as_str())
    .bind(ended_at)
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
    // Closing the meter locks it and reads it under that lock, so a settlement that committed
    // meanwhile is seen, and one that read it before cannot update it any more.
    let meter = sqlx::query(
        "UPDATE meters SET settled_until = NULL WHERE reservation_id = $1 RETURNING charged, held",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let already = Money::from_micros(meter.try_get("charged")?);
    let held: i64 = meter.try_get("held")?;
    // A prepaid block is spent when its tenant ends it early or its workload ends; only an end
    // the platform caused gives back the unused part.
    let platform_ended = matches!(
        reason.as_str(),
        "failed_to_start" | "stopped_by_agent" | NODE_LOST
    );
    let billed_s = if prepaid_block && !platform_ended {
        u64::try_from(duration_s).unwrap_or(0)
    } else {
        seconds
    };
    // Periodic settlements charged part of it already; this is the exact remainder.
    let total = rate.charge_for_seconds(billed_s).max(already);
    let due = total.micros() - already.micros();
    sqlx::query("UPDATE meters SET charged = $1, held = 0 WHERE reservation_id = $2")
        .bind(total.micros())
        .bind(id)
        .execute(&mut *conn)
        .await?;
    let (user, hold) = (
        ledger::user_account(&tenant_id),
        ledger::hold_account(&tenant_id),
    );
    // A block is paid out of its hold; everything else out of the balance, after the hold of
    // its first hour (if no settlement released it yet) goes back.
    let (pay_from, released) = if prepaid_block {
        (&hold, held - due)
    } else {
        (&user, held)
    };
    let moves = [
        (
            format!("release:{id}"),
            &hold,
            &user,
            released,
            Kind::Release,
        ),
        (
            format!("charge:{id}:final"),
            pay_from,
            &PLATFORM_REVENUE.to_owned(),
            due,
            Kind::Charge,
        ),
    ];
    for (transfer_id, debit, credit, amount, kind) in &moves {
        ledger::transfer(
            conn,
            Transfer {
                id: transfer_id,
                debit,
                credit,
                amount: *amount,
                reservation_id: Some(id),
                at: now,
                kind: *kind,
                node_id: None,
            },
        )
        .await?;
    }
    if let Some(owner) = &owner {
        ledger::pay_host_share(
            conn,
            &format!("earn:{id}:final"),
            owner,
            node_id.as_deref(),
            id,
            already.micros(),
            total.micros(),
            share_bps,
            now,
        )
        .await?;
    }
    release_gpus(conn, id).await?;
    tracing::info!(reservation_id = id, status = %status, seconds, charged = %total, "reservation ended");
    Ok(true)
}

/// Queues a reservation of a lost node again: billing ends at `fence_at` (the exact charge for
/// the whole seconds it ran, under `charge:<id>:lost:<epoch>`, and its host's share under
/// `earn:<id>:lost:<epoch>`, so at most once per epoch), its GPU memory is given back, and it
/// waits as `pending` with no node and the next epoch. What it still holds stays held; its
/// billing restarts when it runs again, from where it stopped (`run_before_s`). False when its
/// status changed meanwhile.
pub(super) async fn requeue_lost(
    conn: &mut AnyConnection,
    id: &str,
    from: ReservationStatus,
    fence_at: i64,
    now: i64,
    reason: &str,
) -> Result<bool> {
    let row = sqlx::query(
        "SELECT r.tenant_id, r.tier, r.price_per_hour, r.price_step_s, r.price_after, r.started_at,
                r.duration_s, r.node_id, r.host_share_bps, r.epoch, r.run_before_s, n.owner_id
         FROM reservations r LEFT JOIN nodes n ON n.id = r.node_id WHERE r.id = $1",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let tenant_id: String = row.try_get("tenant_id")?;
    let prepaid_block = row.try_get::<String, _>("tier")? == Tier::Reserved.as_str();
    let rate = rate_of(&row)?;
    let started_at: Option<i64> = row.try_get("started_at")?;
    let duration_s: i64 = row.try_get("duration_s")?;
    let node_id: Option<String> = row.try_get("node_id")?;
    let share_bps: i64 = row.try_get("host_share_bps")?;
    let epoch: i64 = row.try_get("epoch")?;
    let run_before_s: i64 = row.try_get("run_before_s")?;
    let owner: Option<String> = row.try_get("owner_id")?;
    // Whole seconds run in all, counted from its effective start; never past its hours.
    let ran_s = started_at.map_or(run_before_s, |s| {
        ((fence_at - s).max(0) / 1_000_000).min(duration_s)
    });
    let claimed = sqlx::query(
        "UPDATE reservations SET status = 'pending', node_id = NULL, gpus = '[]', epoch = epoch + 1,
            log_read = 0, log_cut = NULL, log_tail = NULL, queued_at = $1, placed_at = NULL, started_at = NULL, run_before_s = $2,
            published = '[]', queue_reason = $5
         WHERE id = $3 AND status = $4",
    )
    .bind(now)
    .bind(ran_s)
    .bind(id)
    .bind(from.as_str())
    .bind(reason)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if claimed != 1 {
        return Ok(false);
    }
    // Closing the meter locks it (see `finish`); it is opened again when the reservation runs.
    let meter = sqlx::query(
        "UPDATE meters SET settled_until = NULL WHERE reservation_id = $1
         RETURNING charged, held, base_charged",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let already = Money::from_micros(meter.try_get("charged")?);
    let held: i64 = meter.try_get("held")?;
    let base: i64 = meter.try_get("base_charged")?;
    let total = rate
        .charge_for_seconds(u64::try_from(ran_s).unwrap_or(0))
        .max(already);
    let due = total.micros() - already.micros();
    let held_after = if prepaid_block { held - due } else { held };
    sqlx::query(
        "UPDATE meters SET charged = $1, held = $2, base_charged = $1, node_id = NULL
         WHERE reservation_id = $3",
    )
    .bind(total.micros())
    .bind(held_after)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    let pay_from = if prepaid_block {
        ledger::hold_account(&tenant_id)
    } else {
        ledger::user_account(&tenant_id)
    };
    ledger::transfer(
        conn,
        Transfer {
            id: &format!("charge:{id}:lost:{epoch}"),
            debit: &pay_from,
            credit: PLATFORM_REVENUE,
            amount: due,
            reservation_id: Some(id),
            at: fence_at,
            kind: Kind::Charge,
            node_id: None,
        },
    )
    .await?;
    if let (Some(owner), Some(node)) = (&owner, &node_id) {
        ledger::pay_host_share(
            conn,
            &format!("earn:{id}:lost:{epoch}"),
            owner,
            Some(node),
            id,
            already.micros(),
            total.micros(),
            share_bps,
            fence_at,
        )
        .await?;
        sqlx::query(
            "INSERT INTO lost_runs (reservation_id, epoch, node_id, charged_from, charged_to,
                host_share_bps, lost_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(id)
        .bind(epoch)
        .bind(node)
        .bind(base)
        .bind(total.micros())
        .bind(share_bps)
        .bind(fence_at)
        .execute(&mut *conn)
        .await?;
    }
    release_gpus(conn, id).await?;
    tracing::info!(reservation_id = id, node_id = ?node_id, epoch = epoch + 1, ran_s, charged = %total, "node lost: reservation queued again");
    Ok(true)
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

/// The end reason of a reservation whose node was lost and whose tenant chose `stop`.
pub(crate) const NODE_LOST: &str = "node_lost";

/// The most of an executor's message a reservation keeps (`end_message`), in characters.
pub(crate) const END_MESSAGE_MAX_CHARS: usize = 1000;

/// What a failed instance's report said, for its tenant: kept when the instance failed (to
/// start, or exited with an error) and its agent said why, at most `END_MESSAGE_MAX_CHARS`.
fn end_message(status: ReservationStatus, report: &InstanceReport) -> Option<String> {
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
