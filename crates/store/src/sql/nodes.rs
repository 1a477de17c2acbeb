//! Nodes: registration with a join token, heartbeats with instance reports, desired state.

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_billing::Rate;
use gpurent_types::agent::{
    AgentEvent, Assignment, GpuInfo, InstanceReport, InstanceState, LogChunk, NodeTelemetry,
    SyncRequest, AGENT_END_REASONS,
};
use gpurent_types::api::{Gpu, Node};
use gpurent_types::{GpuType, Money, NodeStatus, OnNodeLoss, ReservationStatus, Tier};
use sqlx::{AnyConnection, Row};

use super::gpu_hours;
use super::ledger::{self, Kind, Transfer, PLATFORM_REVENUE};
use super::{from_ts, gib, new_id, retry_transient, ts, SqlStore};
use crate::{
    Drained, Fenced, FleetView, NewNode, NodeAction, NodeCertificate, NodeStore, Result, StoreError,
};

async fn insert_gpus(conn: &mut AnyConnection, node_id: &str, gpus: &[GpuInfo]) -> Result<()> {
    for g in gpus {
        let vram = i64::try_from(g.vram_mb).unwrap_or(i64::MAX);
        let gpu_type = GpuType::from_driver_name(&g.model);
        let inserted = sqlx::query(
            "INSERT INTO gpus (uuid, node_id, idx, model, type_name, type_key, vram_mb, free_mb)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7) ON CONFLICT (uuid) DO NOTHING",
        )
        .bind(&g.uuid)
        .bind(node_id)
        .bind(i64::from(g.index))
        .bind(&g.model)
        .bind(gpu_type.display())
        .bind(gpu_type.key())
        .bind(vram)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if inserted == 1 {
            adjust_pool(conn, node_id, gpu_type.key(), 1).await?;
        }
        // As the agent sees it now (a GPU moved to another slot keeps its UUID).
        sqlx::query("UPDATE gpus SET switch_group = $1 WHERE uuid = $2 AND node_id = $3")
            .bind(g.switch_group.map(i64::from))
            .bind(&g.uuid)
            .bind(node_id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Moves a node's count of whole free GPUs of a type by `delta`.
pub(crate) async fn adjust_pool(
    conn: &mut AnyConnection,
    node_id: &str,
    type_key: &str,
    delta: i64,
) -> Result<()> {
    // Upsert only to add: SQLite checks the CHECK of the would-be row before the conflict.
    let sql = if delta > 0 {
        "INSERT INTO gpu_pools (node_id, type_key, whole_free) VALUES ($1, $2, $3)
         ON CONFLICT (node_id, type_key) DO UPDATE SET whole_free = gpu_pools.whole_free + $3"
    } else {
        "UPDATE gpu_pools SET whole_free = whole_free + $3 WHERE node_id = $1 AND type_key = $2"
    };
    sqlx::query(sql)
        .bind(node_id)
        .bind(type_key)
        .bind(delta)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(crate) async fn bump_version(conn: &mut AnyConnection, node_id: &str) -> Result<()> {
    sqlx::query("UPDATE nodes SET desired_version = desired_version + 1 WHERE id = $1")
        .bind(node_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Applies one instance report. Reports of another node or an older epoch are ignored, and a
/// report that would not change anything is a no-op, so duplicates are harmless.
async fn apply_report(
    conn: &mut AnyConnection,
    node_id: &str,
    report: &InstanceReport,
    now: i64,
) -> Result<bool> {
    let row = sqlx::query("SELECT status, node_id, epoch FROM reservations WHERE id = $1")
        .bind(&report.reservation_id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else { return Ok(false) };
    let owner: Option<String> = row.try_get("node_id")?;
    let epoch: i64 = row.try_get("epoch")?;
    if owner.as_deref() != Some(node_id) || epoch != report.epoch {
        tracing::debug!(reservation_id = %report.reservation_id, "ignoring report of a stale epoch");
        return Ok(false);
    }
    let status: String = row.try_get("status")?;
    let status: ReservationStatus = status
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
    use InstanceState as S;
    use ReservationStatus as R;
    match (status, report.state) {
        (R::Pending, S::Starting) => {
            set_status(conn, &report.reservation_id, status, R::Starting).await
        }
        (R::Pending | R::Starting, S::Running) => {
            let published =
                serde_json::to_string(&report.ports).unwrap_or_else(|_| "[]".to_owned());
            // A reservation rescheduled off a lost node continues: its effective start is
            // moved back by the seconds it ran (and was charged for) before, so its hours and
            // its charge go on where they stopped.
            let n = sqlx::query(
                "UPDATE reservations SET status = 'running', started_at = $1 - run_before_s * 1000000,
                    published = $4
                 WHERE id = $2 AND status = $3",
            )
            .bind(now)
            .bind(&report.reservation_id)
            .bind(status.as_str())
            .bind(published)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if n == 1 {
                // Settled up to its start: the first settlement charges from here.
                sqlx::query(
                    "UPDATE meters SET started_at = (SELECT started_at FROM reservations WHERE id = $2),
                        settled_until = $1 WHERE reservation_id = $2",
                )
                    .bind(now)
                    .bind(&report.reservation_id)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(n == 1)
        }
        (s, S::Stopped | S::Exited | S::Failed) if !s.is_terminal() => {
            finish(conn, &report.reservation_id, status, report, now).await
        }
        _ => Ok(false),
    }
}

async fn set_status(
    conn: &mut AnyConnection,
    id: &str,
    from: ReservationStatus,
    to: ReservationStatus,
) -> Result<bool> {
    let n = sqlx::query("UPDATE reservations SET status = $1 WHERE id = $2 AND status = $3")
        .bind(to.as_str())
        .bind(id)
        .bind(from.as_str())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(n == 1)
}

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

/// Ends a reservation whose instance is gone: its final status, the rest of the exact charge
/// for the seconds it ran (transfer id `charge:<id>:final`, so at most once), what it still
/// held given back, the host's share of the charge, and its GPUs freed.
async fn finish(
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

/// Idle reclaim's clock: the running reservations holding a GPU that was busy in this sample
/// (any utilisation; a shared GPU's counts for each of its reservations) were active now.
async fn mark_active(
    conn: &mut AnyConnection,
    node_id: &str,
    samples: &[gpurent_types::agent::GpuSample],
    at: i64,
) -> Result<()> {
    let busy: Vec<&str> = samples
        .iter()
        .filter(|s| s.utilization_pct > 0 && !s.lost)
        .map(|s| s.uuid.as_str())
        .take(64)
        .collect();
    if busy.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = (0..busy.len()).map(|i| format!("${}", i + 3)).collect();
    let sql = format!(
        "UPDATE reservations SET last_active_at = $1
         WHERE status = 'running' AND node_id = $2
           AND id IN (SELECT reservation_id FROM allocations WHERE gpu_uuid IN ({}))",
        list.join(", ")
    );
    let mut q = sqlx::query(&sql).bind(at).bind(node_id);
    for uuid in busy {
        q = q.bind(uuid);
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// Queues a reservation of a lost node again: billing ends at `fence_at` (the exact charge for
/// the whole seconds it ran, under `charge:<id>:lost:<epoch>`, and its host's share under
/// `earn:<id>:lost:<epoch>`, so at most once per epoch), its GPU memory is given back, and it
/// waits as `pending` with no node and the next epoch. What it still holds stays held; its
/// billing restarts when it runs again, from where it stopped (`run_before_s`). False when its
/// status changed meanwhile.
async fn requeue_lost(
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

/// A reservation whose node, or one of whose GPUs, was lost at `fence_at` (`row`: its id,
/// status, on_node_loss, started_at, duration_s): what had run out its hours expired, what
/// was stopping ends, what chose `stop` ends as lost, and the rest waits to run again
/// (`requeue_lost`), each noted in `fenced`.
async fn lose_reservation(
    conn: &mut AnyConnection,
    r: &sqlx::any::AnyRow,
    fence_at: i64,
    now: i64,
    requeue_reason: &str,
    fenced: &mut Fenced,
) -> Result<()> {
    let id: String = r.try_get("id")?;
    let status: ReservationStatus = r
        .try_get::<String, _>("status")?
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
    let choice: String = r.try_get("on_node_loss")?;
    let report = InstanceReport {
        reservation_id: id.clone(),
        epoch: 0,
        state: InstanceState::Stopped,
        exit_code: None,
        message: None,
        ports: Vec::new(),
        end_reason: None,
    };
    let duration_us = r.try_get::<i64, _>("duration_s")?.saturating_mul(1_000_000);
    let deadline = r
        .try_get::<Option<i64>, _>("started_at")?
        .map(|s| s.saturating_add(duration_us))
        .filter(|d| *d <= fence_at);
    let end_as = match (deadline, status) {
        // Its billing already ended when the stop was asked for.
        (_, ReservationStatus::Stopping) => None,
        // Its hours were up before the fence: it expired, wherever it ran.
        (Some(deadline), _) => Some(("expired", deadline)),
        (None, _) if choice == OnNodeLoss::Stop.as_str() => Some((NODE_LOST, fence_at)),
        (None, _) => {
            if requeue_lost(conn, &id, status, fence_at, now, requeue_reason).await? {
                fenced.rescheduled.push(id);
            }
            return Ok(());
        }
    };
    if let Some((reason, at)) = end_as {
        sqlx::query(
            "UPDATE reservations SET end_reason = $1, stop_requested_at = $2
             WHERE id = $3 AND status = $4",
        )
        .bind(reason)
        .bind(at)
        .bind(&id)
        .bind(status.as_str())
        .execute(&mut *conn)
        .await?;
    }
    if finish(conn, &id, status, &report, fence_at).await? {
        fenced.ended.push(id);
    }
    Ok(())
}

/// The live reservations of a node (`column` = node_id) or of one GPU, as `lose_reservation`
/// reads them, in id order (the lock order).
const LIVE_ON: &str = "SELECT id, status, on_node_loss, started_at, duration_s FROM reservations
    WHERE status IN ('pending', 'starting', 'running', 'stopping') AND ";

/// GPUs of the node that its agent no longer reports (restarted with fewer, or one fell off
/// the bus and out of the driver's list) leave placement now, and the work on them is handled
/// as on a lost node; GPUs reported again come back. True when the node's desired state
/// changed.
async fn reconcile_inventory(
    conn: &mut AnyConnection,
    node_id: &str,
    reported: &[GpuInfo],
    at: i64,
) -> Result<bool> {
    let known =
        sqlx::query("SELECT uuid, missing_since FROM gpus WHERE node_id = $1 ORDER BY uuid")
            .bind(node_id)
            .fetch_all(&mut *conn)
            .await?;
    let reported: HashSet<&str> = reported.iter().map(|g| g.uuid.as_str()).collect();
    let mut changed = false;
    let mut gone = Vec::new();
    for g in &known {
        let uuid: String = g.try_get("uuid")?;
        let missing = g.try_get::<Option<i64>, _>("missing_since")?.is_some();
        match (missing, reported.contains(uuid.as_str())) {
            (false, false) => gone.push(uuid),
            (true, true) => {
                // Back: whatever ran on it was moved, so all of it is free again.
                let row = sqlx::query(
                    "UPDATE gpus SET missing_since = NULL, free_mb = vram_mb
                     WHERE uuid = $1 AND node_id = $2 RETURNING type_key",
                )
                .bind(&uuid)
                .bind(node_id)
                .fetch_one(&mut *conn)
                .await?;
                let type_key: String = row.try_get("type_key")?;
                adjust_pool(conn, node_id, &type_key, 1).await?;
                tracing::info!(node_id, gpu = %uuid, "GPU reported again: back in placement");
                changed = true;
            }
            _ => {}
        }
    }
    if gone.is_empty() {
        return Ok(changed);
    }
    // Reservations first (the lock order), then the GPUs they gave back.
    let mut fenced = Fenced::default();
    for uuid in &gone {
        let rows = sqlx::query(&format!(
            "{LIVE_ON} id IN (SELECT reservation_id FROM allocations WHERE gpu_uuid = $1) ORDER BY id"
        ))
        .bind(uuid)
        .fetch_all(&mut *conn)
        .await?;
        for r in &rows {
            lose_reservation(
                conn,
                r,
                at,
                at,
                "a GPU it ran on is gone from its node; waiting to run again",
                &mut fenced,
            )
            .await?;
        }
    }
    for uuid in &gone {
        // Out of placement: no memory free, and not counted as a whole free GPU (which it
        // was unless something it could not move, already ended, still holds it).
        let whole_free = sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM gpus WHERE uuid = $1 AND free_mb = vram_mb",
        )
        .bind(uuid)
        .fetch_one(&mut *conn)
        .await?;
        let type_key: String = sqlx::query_scalar(
            "UPDATE gpus SET missing_since = $1, free_mb = 0 WHERE uuid = $2 AND node_id = $3
             RETURNING type_key",
        )
        .bind(at)
        .bind(uuid)
        .bind(node_id)
        .fetch_one(&mut *conn)
        .await?;
        if whole_free == 1 {
            adjust_pool(conn, node_id, &type_key, -1).await?;
        }
        tracing::warn!(node_id, gpu = %uuid, rescheduled = fenced.rescheduled.len(), ended = fenced.ended.len(), "GPU no longer reported by its agent: out of placement");
    }
    Ok(true)
}

impl SqlStore {
    /// Fences one node not heard from since `seen` (see `NodeStore::fence_lost_nodes`). `None`
    /// when it synced meanwhile (nothing of this is kept).
    async fn fence_node_once(
        &self,
        node_id: &str,
        seen: i64,
        ttl_us: i64,
        now: i64,
    ) -> Result<Option<Fenced>> {
        let fence_at = seen.saturating_add(ttl_us).min(now);
        let mut tx = self.begin().await?;
        let rows = sqlx::query(&format!("{LIVE_ON} node_id = $1 ORDER BY id"))
            .bind(node_id)
            .fetch_all(&mut *tx)
            .await?;
        let mut fenced = Fenced::default();
        for r in &rows {
            lose_reservation(
                &mut tx,
                r,
                fence_at,
                now,
                "its node was lost; waiting to run again",
                &mut fenced,
            )
            .await?;
        }
        // Nodes last in the lock order; the compare-and-set on its last heartbeat loses to a
        // sync that came meanwhile, and then nothing of this is kept.
        let marked = sqlx::query(
            "UPDATE nodes SET status = 'lost', lost_at = COALESCE(lost_at, $1),
                desired_version = desired_version + 1
             WHERE id = $2 AND last_seen_at = $3",
        )
        .bind(fence_at)
        .bind(node_id)
        .bind(seen)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if marked != 1 {
            return Ok(None);
        }
        tx.commit().await?;
        tracing::warn!(
            node_id,
            rescheduled = fenced.rescheduled.len(),
            ended = fenced.ended.len(),
            "node lost: not heard from for the node TTL"
        );
        fenced.nodes.push(node_id.to_owned());
        Ok(Some(fenced))
    }

    /// Rows are locked in one order in every transaction (reservations, accounts, gpus,
    /// gpu_pools, nodes last) so that concurrent transactions cannot deadlock each other.
    async fn sync_once(
        &self,
        node_id: &str,
        report: &SyncRequest,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let at = ts(now);
        let gpus = &report.gpus;
        let mut tx = self.begin().await?;
        // Reservation rows in id order (see above): each one's output, its agent's events (their
        // lines land after the output and before its end), then its report.
        type Of<'a> = (
            Vec<&'a LogChunk>,
            Vec<&'a InstanceReport>,
            Vec<&'a AgentEvent>,
        );
        let mut by_reservation: BTreeMap<&str, Of<'_>> = BTreeMap::new();
        let mut node_events = Vec::new();
        for event in &report.events {
            match &event.reservation_id {
                Some(id) => by_reservation.entry(id).or_default().2.push(event),
                None => node_events.push(event),
            }
        }
        for chunk in &report.logs {
            by_reservation
                .entry(&chunk.reservation_id)
                .or_default()
                .0
                .push(chunk);
        }
        for instance in &report.instances {
            by_reservation
                .entry(&instance.reservation_id)
                .or_default()
                .1
                .push(instance);
        }
        let mut changed = false;
        for (chunks, reports, events) in by_reservation.values() {
            for chunk in chunks {
                super::logs::append(&mut tx, node_id, chunk).await?;
            }
            for event in events {
                super::agent_events::record(&mut tx, node_id, event, at).await?;
            }
            for report in reports {
                changed |= apply_report(&mut tx, node_id, report, at).await?;
            }
        }
        for event in node_events {
            super::agent_events::record(&mut tx, node_id, event, at).await?;
        }
        if let Some(t) = &report.telemetry {
            mark_active(&mut tx, node_id, &t.gpus, at).await?;
            gpu_hours::record(&mut tx, node_id, &t.gpus, at).await?;
        }
        // The whole inventory comes with the first sync after the agent starts (with its host
        // facts); later syncs leave it out.
        if !gpus.is_empty() || report.host.is_some() {
            changed |= reconcile_inventory(&mut tx, node_id, gpus, at).await?;
        }
        let known: HashSet<String> =
            sqlx::query_scalar::<_, String>("SELECT uuid FROM gpus WHERE node_id = $1")
                .bind(node_id)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
        let new: Vec<GpuInfo> = gpus
            .iter()
            .filter(|g| !known.contains(&g.uuid))
            .cloned()
            .collect();
        if !new.is_empty() {
            insert_gpus(&mut tx, node_id, &new).await?;
        }
        let telemetry = report
            .telemetry
            .as_ref()
            .and_then(|t| serde_json::to_string(t).ok());
        sqlx::query(
            "UPDATE nodes SET last_seen_at = $1, desired_version = desired_version + $2,
                telemetry = COALESCE($3, telemetry),
                status = CASE WHEN status = 'lost' THEN 'ready' ELSE status END, lost_at = NULL
             WHERE id = $4",
        )
        .bind(at)
        .bind(i64::from(changed))
        .bind(telemetry)
        .bind(node_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl NodeStore for SqlStore {
    async fn schedule_node(
        &self,
        node: &str,
        action: NodeAction,
        now: DateTime<Utc>,
    ) -> Result<Drained> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("SELECT id, status FROM nodes WHERE id = $1 OR name = $1")
            .bind(node)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "node",
                id: node.to_owned(),
            })?;
        let node_id: String = row.try_get("id")?;
        let status: String = row.try_get("status")?;
        if status == NodeStatus::Lost.as_str() && action != NodeAction::Uncordon {
            return Err(StoreError::Conflict(format!(
                "node {node} is lost: its work was moved when it was fenced"
            )));
        }
        let mut moved = Vec::new();
        if action == NodeAction::Drain {
            let rows = sqlx::query(
                "SELECT id, status FROM reservations
                 WHERE node_id = $1 AND status IN ('pending', 'starting', 'running') ORDER BY id",
            )
            .bind(&node_id)
            .fetch_all(&mut *tx)
            .await?;
            let at = ts(now);
            for r in &rows {
                let id: String = r.try_get("id")?;
                let from: ReservationStatus = r
                    .try_get::<String, _>("status")?
                    .parse()
                    .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
                // Billed to now on this node, then queued again with the next epoch: its agent
                // stops this copy (its desired state no longer lists it), another node runs the
                // next one, billed from when it runs.
                if requeue_lost(
                    &mut tx,
                    &id,
                    from,
                    at,
                    at,
                    "its node is being drained; waiting to run again",
                )
                .await?
                {
                    moved.push(id);
                }
            }
        }
        let new_status = match action {
            NodeAction::Uncordon => NodeStatus::Ready,
            NodeAction::Cordon | NodeAction::Drain => NodeStatus::Draining,
        };
        // A lost node turns ready when its agent syncs again, not by an uncordon.
        sqlx::query(
            "UPDATE nodes SET status = $1, desired_version = desired_version + 1
             WHERE id = $2 AND status IN ('ready', 'draining')",
        )
        .bind(new_status.as_str())
        .bind(&node_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Drained {
            node_id,
            status: if status == NodeStatus::Lost.as_str() {
                NodeStatus::Lost
            } else {
                new_status
            },
            moved,
        })
    }

    async fn record_health(
        &self,
        node_id: &str,
        issues: &[gpurent_types::api::HealthIssue],
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let json = if issues.is_empty() {
            None
        } else {
            Some(serde_json::to_string(issues).map_err(|e| StoreError::Corrupt(e.to_string()))?)
        };
        let mut tx = self.begin().await?;
        let before: Option<Option<String>> =
            sqlx::query_scalar("SELECT health FROM nodes WHERE id = $1")
                .bind(node_id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(before) = before else {
            return Err(StoreError::NotFound {
                what: "node",
                id: node_id.to_owned(),
            });
        };
        if before == json {
            return Ok(false);
        }
        sqlx::query("UPDATE nodes SET health = $1, healthy = $2 WHERE id = $3")
            .bind(&json)
            .bind(i64::from(issues.is_empty()))
            .bind(node_id)
            .execute(&mut *tx)
            .await?;
        let (kind, detail) = if issues.is_empty() {
            (
                "node_healthy",
                "every GPU passes the health rules".to_owned(),
            )
        } else {
            let what: Vec<String> = issues
                .iter()
                .map(|i| format!("{}: {} ({})", i.gpu_uuid, i.detail, i.rule))
                .collect();
            ("node_unhealthy", what.join("; "))
        };
        sqlx::query("INSERT INTO events (at, node_id, kind, detail) VALUES ($1, $2, $3, $4)")
            .bind(ts(now))
            .bind(node_id)
            .bind(kind)
            .bind(detail)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(issues.is_empty() && before.is_some())
    }

    async fn last_event_id(&self) -> Result<i64> {
        let last: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM events")
            .fetch_one(&self.pool)
            .await?;
        Ok(last.unwrap_or(0))
    }

    async fn events(&self, after: i64, limit: u32) -> Result<Vec<gpurent_types::api::Event>> {
        let rows = sqlx::query(
            "SELECT id, at, node_id, kind, detail, reservation_id FROM events
             WHERE id > $1 ORDER BY id LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(gpurent_types::api::Event {
                    id: r.try_get("id")?,
                    at: from_ts(r.try_get("at")?)?,
                    node_id: r.try_get("node_id")?,
                    kind: r.try_get("kind")?,
                    detail: r.try_get("detail")?,
                    reservation_id: r.try_get("reservation_id")?,
                })
            })
            .collect()
    }

    async fn set_verification(
        &self,
        node_id: &str,
        verification: &gpurent_types::api::HostVerification,
    ) -> Result<()> {
        let json =
            serde_json::to_string(verification).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let updated =
            sqlx::query("UPDATE nodes SET verification = $1, verified = $2 WHERE id = $3")
                .bind(json)
                .bind(i64::from(verification.ok))
                .bind(node_id)
                .execute(&self.pool)
                .await?
                .rows_affected();
        found(updated, node_id)
    }

    async fn set_isolation(&self, node_id: &str, isolated: bool) -> Result<()> {
        let updated = sqlx::query("UPDATE nodes SET isolated = $1 WHERE id = $2")
            .bind(i64::from(isolated))
            .bind(node_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        found(updated, node_id)
    }

    async fn set_capacity(
        &self,
        node_id: &str,
        cpus: Option<u32>,
        memory_mb: Option<u64>,
    ) -> Result<()> {
        let updated = sqlx::query("UPDATE nodes SET cpus = $1, memory_mb = $2 WHERE id = $3")
            .bind(cpus.map(i64::from))
            .bind(memory_mb.and_then(|m| i64::try_from(m).ok()))
            .bind(node_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        found(updated, node_id)
    }

    async fn create_join_token(
        &self,
        token_hash: &str,
        created_by: &str,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO join_tokens (token_hash, created_by, expires_at, created_at)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(token_hash)
        .bind(created_by)
        .bind(ts(expires_at))
        .bind(ts(now))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn register_node(&self, node: NewNode, now: DateTime<Utc>) -> Result<String> {
        let at = ts(now);
        let mut tx = self.begin().await?;
        // The node belongs to whoever made its join token: its earnings go to them.
        let owner: Option<String> = sqlx::query_scalar(
            "SELECT created_by FROM join_tokens WHERE token_hash = $1 AND expires_at > $2",
        )
        .bind(&node.join_token_hash)
        .bind(at)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(owner) = owner else {
            return Err(StoreError::InvalidJoinToken);
        };
        let id = new_id();
        let inserted = sqlx::query(
            "INSERT INTO nodes (id, name, token_hash, executor, gpu_backend, desired_version,
                                last_seen_at, created_at, owner_id, verification, verified, isolated)
             VALUES ($1, $2, $3, $4, $5, 1, $6, $6, $7, $8, $9, $10) ON CONFLICT (name) DO NOTHING",
        )
        .bind(&id)
        .bind(&node.name)
        .bind(&node.node_token_hash)
        .bind(&node.executor)
        .bind(&node.gpu_backend)
        .bind(at)
        .bind(&owner)
        .bind(
            node.verification
                .as_ref()
                .and_then(|v| serde_json::to_string(v).ok()),
        )
        .bind(i64::from(node.verification.as_ref().is_none_or(|v| v.ok)))
        .bind(i64::from(node.isolated))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            return Err(StoreError::Conflict(format!(
                "a node named {:?} is already registered; restart its agent with its data dir to resume it",
                node.name
            )));
        }
        let uuids: HashSet<&str> = node.gpus.iter().map(|g| g.uuid.as_str()).collect();
        if uuids.len() != node.gpus.len() {
            return Err(StoreError::Conflict(
                "the node reported one GPU UUID twice".to_owned(),
            ));
        }
        let taken: Option<String> = {
            let mut found = None;
            for g in &node.gpus {
                let owner: Option<String> =
                    sqlx::query_scalar("SELECT node_id FROM gpus WHERE uuid = $1")
                        .bind(&g.uuid)
                        .fetch_optional(&mut *tx)
                        .await?;
                if owner.is_some() {
                    found = Some(g.uuid.clone());
                    break;
                }
            }
            found
        };
        if let Some(uuid) = taken {
            return Err(StoreError::Conflict(format!(
                "GPU {uuid} already belongs to another node"
            )));
        }
        insert_gpus(&mut tx, &id, &node.gpus).await?;
        tx.commit().await?;
        tracing::info!(node_id = %id, name = %node.name, gpus = node.gpus.len(), "node registered");
        Ok(id)
    }

    async fn authenticate_node(&self, token_hash: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM nodes WHERE token_hash = $1")
                .bind(token_hash)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn set_node_certificate(&self, node_id: &str, sha256: &str) -> Result<()> {
        let updated = sqlx::query("UPDATE nodes SET cert_sha256 = $1 WHERE id = $2")
            .bind(sha256)
            .bind(node_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        found(updated, node_id)
    }

    async fn node_name(&self, node_id: &str) -> Result<String> {
        sqlx::query_scalar("SELECT name FROM nodes WHERE id = $1")
            .bind(node_id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "node",
                id: node_id.to_owned(),
            })
    }

    async fn node_certificate(&self, node_id: &str) -> Result<NodeCertificate> {
        let row: Option<(Option<String>, Option<i64>)> =
            sqlx::query_as("SELECT cert_sha256, cert_revoked_at FROM nodes WHERE id = $1")
                .bind(node_id)
                .fetch_optional(&self.pool)
                .await?;
        let (sha256, revoked_at) = row.ok_or_else(|| StoreError::NotFound {
            what: "node",
            id: node_id.to_owned(),
        })?;
        Ok(NodeCertificate {
            sha256,
            revoked: revoked_at.is_some(),
        })
    }

    async fn revoke_node(&self, node: &str, now: DateTime<Utc>) -> Result<String> {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT id FROM nodes WHERE id = $1 OR name = $1 ORDER BY id")
                .bind(node)
                .fetch_all(&self.pool)
                .await?;
        let node_id = match ids.as_slice() {
            [id] => id.clone(),
            [] => {
                return Err(StoreError::NotFound {
                    what: "node",
                    id: node.to_owned(),
                })
            }
            _ => {
                return Err(StoreError::Conflict(format!(
                    "several nodes are named {node}: give its id"
                )))
            }
        };
        let updated = sqlx::query(
            "UPDATE nodes SET cert_revoked_at = COALESCE(cert_revoked_at, $1) WHERE id = $2",
        )
        .bind(ts(now))
        .bind(&node_id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        found(updated, &node_id)?;
        tracing::warn!(%node_id, "node certificate revoked");
        Ok(node_id)
    }

    async fn sync_node(
        &self,
        node_id: &str,
        report: &SyncRequest,
        now: DateTime<Utc>,
    ) -> Result<()> {
        retry_transient("sync_node", || self.sync_once(node_id, report, now)).await
    }

    async fn prune_gpu_hours(&self, before: DateTime<Utc>) -> Result<u64> {
        gpu_hours::prune(&self.pool, ts(before)).await
    }

    async fn log_rooms(&self, node_id: &str) -> Result<BTreeMap<String, u64>> {
        let mut conn = self.pool.acquire().await?;
        super::logs::rooms(&mut conn, node_id).await
    }

    async fn desired_version(&self, node_id: &str) -> Result<i64> {
        sqlx::query_scalar("SELECT desired_version FROM nodes WHERE id = $1")
            .bind(node_id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("node", node_id))
    }

    async fn desired_state(&self, node_id: &str) -> Result<(i64, Vec<Assignment>)> {
        let mut tx = self.begin().await?;
        let version: i64 = sqlx::query_scalar("SELECT desired_version FROM nodes WHERE id = $1")
            .bind(node_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::not_found("node", node_id))?;
        let rows = sqlx::query(
            "SELECT id, status, epoch, gpus, vram_mb, image, command, env, log_read, ports,
                stop_grace_s, checkpoint, secrets FROM reservations
             WHERE node_id = $1 AND status IN ('pending', 'starting', 'running', 'stopping')
             ORDER BY created_at, id",
        )
        .bind(node_id)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
        let assignments = rows
            .iter()
            .map(|r| {
                let status: String = r.try_get("status")?;
                let gpus: String = r.try_get("gpus")?;
                let command: String = r.try_get("command")?;
                let env: String = r.try_get("env")?;
                Ok(Assignment {
                    reservation_id: r.try_get("id")?,
                    epoch: r.try_get("epoch")?,
                    gpus: serde_json::from_str(&gpus).map_err(corrupt)?,
                    vram_mb: r
                        .try_get::<Option<i64>, _>("vram_mb")?
                        .map(|v| u64::try_from(v).unwrap_or(0)),
                    image: r.try_get("image")?,
                    command: serde_json::from_str(&command).map_err(corrupt)?,
                    env: serde_json::from_str::<BTreeMap<String, String>>(&env).map_err(corrupt)?,
                    run: status != "stopping",
                    ports: serde_json::from_str(&r.try_get::<String, _>("ports")?)
                        .map_err(corrupt)?,
                    log_offset: u64::try_from(r.try_get::<i64, _>("log_read")?).unwrap_or(0),
                    stop_grace_s: r
                        .try_get::<Option<i64>, _>("stop_grace_s")?
                        .map(|g| u64::try_from(g).unwrap_or(0)),
                    checkpoint: r.try_get::<i64, _>("checkpoint")? != 0,
                    secrets: Default::default(),
                    sealed_secrets: r.try_get("secrets")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((version, assignments))
    }

    async fn list_nodes(
        &self,
        live_since: DateTime<Utc>,
        owner: Option<&str>,
    ) -> Result<Vec<Node>> {
        let nodes = sqlx::query(
            "SELECT id, name, executor, gpu_backend, last_seen_at, telemetry, owner_id, status,
                    verification, verified, health, healthy, isolated, cpus, memory_mb FROM nodes
             WHERE $1 = '' OR owner_id = $1 ORDER BY name",
        )
        .bind(owner.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        let gpus = sqlx::query(
            "SELECT node_id, uuid, type_name, vram_mb, free_mb, switch_group, missing_since
             FROM gpus ORDER BY node_id, idx",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut by_node: BTreeMap<String, Vec<Gpu>> = BTreeMap::new();
        for g in gpus {
            let vram: i64 = g.try_get("vram_mb")?;
            let free: i64 = g.try_get("free_mb")?;
            let missing = g.try_get::<Option<i64>, _>("missing_since")?.is_some();
            let status = if missing {
                "missing"
            } else if free == vram {
                "free"
            } else if free == 0 {
                "allocated"
            } else {
                "shared"
            };
            by_node.entry(g.try_get("node_id")?).or_default().push(Gpu {
                uuid: g.try_get("uuid")?,
                model: g.try_get("type_name")?,
                vram_gb: gib(vram),
                status: status.to_owned(),
                switch_group: super::switch_of(&g)?,
                telemetry: None,
            });
        }
        let live = ts(live_since);
        nodes
            .iter()
            .map(|n| {
                let id: String = n.try_get("id")?;
                let last_seen: i64 = n.try_get("last_seen_at")?;
                let telemetry: Option<String> = n.try_get("telemetry")?;
                // Telemetry is informative: an unreadable sample is shown as none.
                let telemetry: NodeTelemetry = telemetry
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or_default();
                let mut gpus = by_node.remove(&id).unwrap_or_default();
                for g in &mut gpus {
                    g.telemetry = telemetry.gpus.iter().find(|s| s.uuid == g.uuid).cloned();
                }
                Ok(Node {
                    gpus,
                    owner_id: n.try_get("owner_id")?,
                    driver_version: telemetry.driver_version.clone(),
                    cuda_version: telemetry.cuda_version.clone(),
                    id,
                    name: n.try_get("name")?,
                    // A ready node past the TTL that the maintenance loop has not fenced yet
                    // is `unreachable`; one that failed host verification `unverified`, one
                    // whose GPUs breach a health rule `unhealthy`.
                    status: match n.try_get::<String, _>("status")? {
                        s if s == NodeStatus::Ready.as_str() => if last_seen < live {
                            "unreachable"
                        } else if n.try_get::<i64, _>("verified")? == 0 {
                            "unverified"
                        } else if n.try_get::<i64, _>("healthy")? == 0 {
                            "unhealthy"
                        } else {
                            "ready"
                        }
                        .to_owned(),
                        s => s,
                    },
                    health: n
                        .try_get::<Option<String>, _>("health")?
                        .and_then(|h| serde_json::from_str(&h).ok())
                        .unwrap_or_default(),
                    // Informative like telemetry: an unreadable record is shown as none.
                    verification: n
                        .try_get::<Option<String>, _>("verification")?
                        .and_then(|v| serde_json::from_str(&v).ok()),
                    executor: n.try_get("executor")?,
                    isolated: n.try_get::<i64, _>("isolated")? != 0,
                    gpu_backend: n.try_get("gpu_backend")?,
                    cpus: n
                        .try_get::<Option<i64>, _>("cpus")?
                        .and_then(|c| u32::try_from(c).ok()),
                    memory_mb: n
                        .try_get::<Option<i64>, _>("memory_mb")?
                        .and_then(|m| u64::try_from(m).ok()),
                    last_seen_at: from_ts(last_seen)?,
                })
            })
            .collect()
    }

    async fn fence_lost_nodes(
        &self,
        ttl: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<Fenced> {
        let ttl_us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
        let at = ts(now);
        // A lost node is swept again while work is still on it: a stop or a placement that
        // won a race with its fencing left it there.
        let due = sqlx::query(
            "SELECT id, last_seen_at FROM nodes n WHERE last_seen_at < $1
               AND (status <> 'lost' OR EXISTS (
                   SELECT 1 FROM reservations r WHERE r.node_id = n.id
                     AND r.status IN ('pending', 'starting', 'running', 'stopping')))
             ORDER BY id",
        )
        .bind(at.saturating_sub(ttl_us))
        .fetch_all(&self.pool)
        .await?;
        let mut all = Fenced::default();
        for n in due {
            let id: String = n.try_get("id")?;
            let seen: i64 = n.try_get("last_seen_at")?;
            let done =
                retry_transient("fence_node", || self.fence_node_once(&id, seen, ttl_us, at))
                    .await?;
            if let Some(f) = done {
                all.nodes.extend(f.nodes);
                all.rescheduled.extend(f.rescheduled);
                all.ended.extend(f.ended);
            }
        }
        Ok(all)
    }

    async fn fleet(&self, live_since: DateTime<Utc>) -> Result<FleetView> {
        let live = ts(live_since);
        let mut fleet = FleetView::default();
        let nodes = sqlx::query("SELECT telemetry FROM nodes WHERE last_seen_at >= $1")
            .bind(live)
            .fetch_all(&self.pool)
            .await?;
        for n in nodes {
            fleet.live_nodes += 1;
            let telemetry: Option<String> = n.try_get("telemetry")?;
            // Telemetry is informative: an unreadable sample counts as none.
            let Some(t) = telemetry.and_then(|t| serde_json::from_str::<NodeTelemetry>(&t).ok())
            else {
                continue;
            };
            fleet
                .gpu_utilization_pct
                .extend(t.gpus.iter().map(|g| g.utilization_pct));
            fleet.cpu_utilization_pct.extend(t.cpu_utilization_pct);
        }
        // Summed here rather than by SUM(), whose type differs between the two databases.
        let gpus = sqlx::query(
            "SELECT g.vram_mb, g.free_mb FROM gpus g JOIN nodes n ON n.id = g.node_id
             WHERE n.last_seen_at >= $1",
        )
        .bind(live)
        .fetch_all(&self.pool)
        .await?;
        for g in gpus {
            fleet.gpus += 1;
            fleet.vram_mb += u64::try_from(g.try_get::<i64, _>("vram_mb")?).unwrap_or(0);
            fleet.free_mb += u64::try_from(g.try_get::<i64, _>("free_mb")?).unwrap_or(0);
        }
        let queued: Vec<Option<i64>> = sqlx::query_scalar(
            "SELECT queued_at FROM reservations WHERE status = 'pending' AND node_id IS NULL",
        )
        .fetch_all(&self.pool)
        .await?;
        fleet.queued = u32::try_from(queued.len()).unwrap_or(u32::MAX);
        fleet.oldest_queued_at = queued
            .into_iter()
            .flatten()
            .min()
            .map(from_ts)
            .transpose()?;
        Ok(fleet)
    }
}

/// `NotFound` when an update by node id touched no row.
fn found(updated: u64, node_id: &str) -> Result<()> {
    if updated == 0 {
        return Err(StoreError::NotFound {
            what: "node",
            id: node_id.to_owned(),
        });
    }
    Ok(())
}
