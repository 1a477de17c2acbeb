//! Creating a reservation: the replay of an earlier request with the same Idempotency-Key,
//! the prepaid hold, the reservation's row and meter, the queued reservation, and why nothing
//! fits.

use gpurent_billing::{PriceList, Quote, Size};
use gpurent_sched::queue::Reason;
use gpurent_sched::NoFit;
use gpurent_types::api::Reservation;
use gpurent_types::{Money, Tier};
use sqlx::{AnyConnection, Row};

use super::batch::{Answers, Arg, Batch};
use super::gpus;
use super::ledger;
use super::placement::Attempt;
use super::rows::{fetch_reservation, reservation_fields, reservation_from_row};
use super::{new_id, ts, SqlStore};
use crate::{NewReservation, Result, Scope, StoreError, Want};
use chrono::{DateTime, Utc};

/// The reservation of a tenant's earlier request with an `Idempotency-Key`, and its hash.
const EARLIER: &str =
    "SELECT id, request_hash FROM reservations WHERE tenant_id = $1 AND idempotency_key = $2";

/// The reservation an earlier request with the same `Idempotency-Key` made, if any.
pub(super) async fn earlier_reservation(
    conn: &mut AnyConnection,
    new: &NewReservation,
) -> Result<Option<Reservation>> {
    let Some(key) = &new.idempotency_key else {
        return Ok(None);
    };
    let earlier = sqlx::query(EARLIER)
        .bind(&new.tenant_id)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = earlier else { return Ok(None) };
    let hash: Option<String> = row.try_get("request_hash")?;
    if hash.as_deref() != Some(new.request_hash.as_str()) {
        return Err(StoreError::IdempotencyMismatch);
    }
    let id: String = row.try_get("id")?;
    Ok(Some(fetch_reservation(conn, &id, &Scope::All).await?))
}

/// The tenant's part of a new reservation, last in its transaction so that what one tenant's
/// reservations wait for each other is short: its caps (read by the `caps::push_read` that
/// `answers` answered at index `caps`), then its hold.
#[allow(clippy::too_many_arguments)]
pub(super) async fn admit(
    conn: &mut AnyConnection,
    backend: crate::Backend,
    answers: &Answers,
    caps: usize,
    new: &NewReservation,
    quote: &Quote,
    id: &str,
    at: i64,
) -> Result<()> {
    super::caps::check(
        conn,
        backend,
        answers,
        caps,
        new,
        quote.price_per_hour,
        id,
        at,
    )
    .await?;
    take_hold(conn, backend, new, id, quote.hold, at).await
}

/// Prepaid: the first hour (or all of a shorter reservation, or the whole of a reserved block)
/// moves into the tenant's hold, only if the balance covers it.
pub(super) async fn take_hold(
    conn: &mut AnyConnection,
    backend: crate::Backend,
    new: &NewReservation,
    id: &str,
    hold: Money,
    at: i64,
) -> Result<()> {
    if hold > Money::ZERO {
        let mut batch = Batch::default();
        let holds = ledger::push_holds(
            &mut batch,
            &[ledger::Hold {
                tenant_id: &new.tenant_id,
                reservation_id: id,
                amount: hold.micros(),
                at,
            }],
        );
        if holds.covered(&batch.run(conn, backend).await?)? {
            return Ok(());
        }
    }
    // Only a refusal (or a hold of nothing, which needs credit left) reads the balance.
    let balance = ledger::balance_of(conn, &ledger::user_account(&new.tenant_id))
        .await?
        .map(Money::from_micros)
        .ok_or_else(|| StoreError::not_found("user", &new.tenant_id))?;
    if hold > Money::ZERO || balance <= Money::ZERO {
        return Err(StoreError::InsufficientCredit {
            needed: hold,
            balance,
        });
    }
    Ok(())
}

/// Where a new reservation goes: onto GPUs now, or into the queue.
pub(super) enum Destination<'a> {
    Placed {
        node_id: &'a str,
        /// The node's name, as the reservation shows it.
        node_name: &'a str,
        gpus: &'a [&'a str],
    },
    Queued {
        reason: &'a str,
    },
}

/// A new reservation as `reserve` and the queue record it.
pub(super) struct NewRow<'a> {
    pub id: &'a str,
    pub new: &'a NewReservation,
    /// The GPU model's name as the node reported it.
    pub type_name: &'a str,
    pub quote: &'a Quote,
    pub host_share_bps: u32,
    pub at: i64,
    pub destination: Destination<'a>,
    /// Placed beyond its tenant's quota of a type with quotas.
    pub borrowed: bool,
}

/// Adds to `batch` the writing of new reservations (`pending`, epoch 1), returned as they
/// read back (nothing else in the transaction changes their rows), and of their meters holding
/// each one's `quote.hold`: two statements, however many rows (`one`: for `Batch::run_as_one`,
/// the meters read the rows from the insert's answer). Returns the answer that holds the
/// reservations' rows ([`reservations_of`]).
pub(super) fn push_inserts(batch: &mut Batch, rows: &[NewRow<'_>], one: bool) -> usize {
    let mut values = Vec::with_capacity(rows.len());
    let mut args = Vec::with_capacity(rows.len() * ROW_ARGS);
    for row in rows {
        let n = args.len();
        let at = |i: usize| format!("${}", n + i);
        let list = |from: usize, to: usize| (from..=to).map(at).collect::<Vec<_>>().join(", ");
        values.push(format!(
            "({}, 'pending', {}, 1, {})",
            list(1, 2),
            list(3, 11),
            list(12, ROW_ARGS)
        ));
        args.extend(row_args(row));
    }
    let row_part = batch.push(
        format!(
            concat!(
                "INSERT INTO reservations (id, tenant_id, status, gpu_type, gpu_count, vram_mb,
                tier, bid, price_per_hour, duration_s, node_id, gpus, epoch, image, command,
                env, created_at, idempotency_key, request_hash, ports, price_step_s,
                price_after, host_share_bps, priority, placed_at, queued_at, queue_reason,
                type_key, on_node_loss, idle_reclaim, checkpoint, secrets, secret_names,
                http_ports, volumes, created_by, borrowed, endpoint_id, endpoint_replica,
                endpoint_gen, restart_policy, max_restarts, array_id, array_index)
             VALUES {} RETURNING ",
                reservation_fields!(),
                ", node_id, price_step_s, price_after, host_share_bps,
                CAST(0 AS BIGINT) AS charged, CAST(0 AS BIGINT) AS held,
                CAST(NULL AS TEXT) AS node_name, CAST(NULL AS TEXT) AS team_name,
                CAST(NULL AS TEXT) AS endpoint_name"
            ),
            values.join(", ")
        ),
        args,
    );
    // Each meter holds its reservation's hold.
    let mut cases = String::new();
    let mut ids = Vec::with_capacity(rows.len());
    let mut args = Vec::with_capacity(rows.len() * 2);
    for row in rows {
        let (i, h) = (args.len() + 1, args.len() + 2);
        cases.push_str(&format!(" WHEN ${i} THEN CAST(${h} AS BIGINT)"));
        ids.push(format!("${i}"));
        args.push(Arg::from(row.id));
        args.push(Arg::from(row.quote.hold.micros()));
    }
    batch.push(
        format!(
            "INSERT INTO meters (reservation_id, tenant_id, node_id, prepaid_block,
                price_per_hour, price_step_s, price_after, duration_s, host_share_bps, charged,
                held)
             SELECT id, tenant_id, node_id, CASE WHEN tier = 'reserved' THEN 1 ELSE 0 END,
                price_per_hour, price_step_s, price_after, duration_s, host_share_bps, 0,
                CASE id{cases} END
             FROM {}",
            if one {
                format!("p{row_part}")
            } else {
                format!("reservations WHERE id IN ({})", ids.join(", "))
            }
        ),
        args,
    );
    row_part
}

/// The arguments of one row of [`push_inserts`], in its columns' order (less the literals).
const ROW_ARGS: usize = 42;

fn row_args(row: &NewRow<'_>) -> Vec<Arg> {
    let (new, quote) = (row.new, row.quote);
    let (gpu_count, vram_mb) = count_and_share(new.want);
    let (node_id, gpus, placed_at, queued_at, reason) = match row.destination {
        Destination::Placed { node_id, gpus, .. } => {
            (Some(node_id), gpus, Some(row.at), None, None)
        }
        Destination::Queued { reason } => (None, &[][..], None, Some(row.at), Some(reason)),
    };
    let stepped = quote.rate.step_s < new.duration_s;
    vec![
        Arg::from(row.id),
        Arg::from(&new.tenant_id),
        Arg::from(row.type_name),
        Arg::from(i64::from(gpu_count)),
        Arg::from(vram_mb.map(|v| i64::try_from(v).unwrap_or(i64::MAX))),
        Arg::from(new.tier.as_str()),
        Arg::from((new.tier == Tier::Spot).then_some(quote.price_per_hour.micros())),
        Arg::from(quote.price_per_hour.micros()),
        Arg::from(i64::try_from(new.duration_s).unwrap_or(i64::MAX)),
        Arg::from(node_id),
        Arg::from(to_json(&gpus)),
        Arg::from(&new.image),
        Arg::from(to_json(&new.command)),
        Arg::from(to_json(&new.env)),
        Arg::from(row.at),
        Arg::from(&new.idempotency_key),
        Arg::from(&new.request_hash),
        Arg::from(to_json(&new.ports)),
        Arg::from(stepped.then(|| i64::try_from(quote.rate.step_s).unwrap_or(i64::MAX))),
        Arg::from(stepped.then_some(quote.rate.then.micros())),
        Arg::from(i64::from(row.host_share_bps)),
        Arg::from(quote.preemptible().then_some(quote.priority)),
        Arg::from(placed_at),
        Arg::from(queued_at),
        Arg::from(reason),
        Arg::from(new.gpu_type.key()),
        Arg::from(new.on_node_loss.as_str()),
        Arg::from(i64::from(new.idle_reclaim)),
        Arg::from(i64::from(new.checkpoint)),
        Arg::from(&new.sealed_secrets),
        Arg::from(to_json(&new.secret_names)),
        Arg::from(to_json(&new.http_ports)),
        Arg::from(to_json(&new.mounts)),
        Arg::from(&new.created_by),
        Arg::from(i64::from(row.borrowed)),
        Arg::from(&new.replica_of.as_ref().map(|r| r.endpoint_id.clone())),
        Arg::from(new.replica_of.as_ref().map(|r| big(r.index))),
        Arg::from(new.replica_of.as_ref().map(|r| big(r.generation))),
        Arg::from(new.restart.as_str()),
        Arg::from(i64::from(new.max_restarts)),
        Arg::from(&new.array_of.as_ref().map(|(id, _)| id.clone())),
        Arg::from(new.array_of.as_ref().map(|&(_, index)| big(index))),
    ]
}

/// The one reservation a [`push_inserts`] of `row` wrote, its answer at `row_part`.
pub(super) fn reservation_of(
    answers: &Answers,
    row_part: usize,
    row: &NewRow<'_>,
) -> Result<Reservation> {
    reservations_of(answers, row_part, std::slice::from_ref(row))?
        .pop()
        .ok_or_else(|| StoreError::Corrupt("an insert returned no row".to_owned()))
}

/// The answers of a batch with a [`push_inserts`], or `None` when the same Idempotency-Key
/// committed concurrently (the batch failed on it): the next attempt returns that one.
pub(super) fn unless_replayed(answers: Result<Answers>) -> Result<Option<Answers>> {
    match answers {
        Ok(answers) => Ok(Some(answers)),
        Err(e) if e.is_unique_violation() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The reservations [`push_inserts`] wrote, in the order of `rows`, their rows' answer at
/// `row_part`: read back as `fetch_reservation` reads them (the meter's hold and the node's
/// name are the new rows' own).
pub(super) fn reservations_of(
    answers: &Answers,
    row_part: usize,
    rows: &[NewRow<'_>],
) -> Result<Vec<Reservation>> {
    let mut by_id = std::collections::HashMap::with_capacity(rows.len());
    for r in answers.rows(row_part) {
        let reservation = reservation_from_row(r)?;
        by_id.insert(reservation.id.clone(), reservation);
    }
    rows.iter()
        .map(|row| {
            let mut r = by_id.remove(row.id).ok_or_else(|| {
                StoreError::Corrupt(format!("the insert of {} returned no row", row.id))
            })?;
            r.held = row.quote.hold;
            r.node = match row.destination {
                Destination::Placed { node_name, .. } => Some(node_name.to_owned()),
                Destination::Queued { .. } => None,
            };
            Ok(r)
        })
        .collect()
}

pub(super) fn size_of(want: Want, gpu_vram_mb: u64) -> Size {
    match want {
        Want::Whole { count } => Size::Whole { count, gpu_vram_mb },
        Want::Share { vram_mb } => Size::Share {
            vram_mb,
            gpu_vram_mb,
        },
    }
}

/// `new`'s price on its tier, for a card of `gpu_vram_mb` (a share is its part of it).
pub(super) fn quote_of(
    prices: &PriceList,
    new: &NewReservation,
    gpu_vram_mb: u64,
) -> Result<Quote> {
    Ok(prices.quote(
        &new.gpu_type,
        size_of(new.want, gpu_vram_mb),
        new.duration_s,
        new.tier,
        new.bid,
    )?)
}

/// The GPUs a reservation of `want` counts, and the memory of a share (`None`: whole GPUs).
fn count_and_share(want: Want) -> (u32, Option<u64>) {
    match want {
        Want::Whole { count } => (count, None),
        Want::Share { vram_mb } => (1, Some(vram_mb)),
    }
}

/// Serialises the small JSON columns (GPU list, command, env); these types cannot fail to.
pub(super) fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

impl SqlStore {
    /// Records `new` as queued: no node, no GPUs, the first hour held as for a placement.
    pub(super) async fn try_enqueue(
        &self,
        new: &NewReservation,
        prices: &PriceList,
        live_since: i64,
        now: DateTime<Utc>,
    ) -> Result<Attempt> {
        let at = ts(now);
        let mut tx = self.begin().await?;
        if let Some(r) = earlier_reservation(&mut tx, new).await? {
            return Ok(Attempt::Done(Box::new(r), Vec::new()));
        }
        super::volume_mounts::claim(&mut tx, self.backend, new).await?;
        let key = new.gpu_type.key();
        let Some((vram, type_name, most_on_one_node)) = gpus::largest(&mut tx, key).await? else {
            // No GPU of the type at all: the reason says which types there are.
            return Err(no_capacity_reason(&mut tx, new, live_since).await?);
        };
        // Work that no node could ever take is refused, not queued until it times out.
        match new.want {
            Want::Whole { count } if i64::from(count) > most_on_one_node => {
                return Err(StoreError::NoCapacity(format!(
                    "asked for {count} whole {type_name} GPUs on one node; no node has more than {most_on_one_node}"
                )));
            }
            Want::Share { vram_mb } if vram_mb > vram => {
                return Err(StoreError::NoCapacity(format!(
                    "asked for {vram_mb} MiB of one {type_name} GPU; the largest has {vram} MiB"
                )));
            }
            _ => {}
        }
        let quote = quote_of(prices, new, vram)?;
        let reason = match new.want {
            Want::Whole { count } => NoFit::NotEnoughOnOneNode {
                wanted: count,
                most_on_one_node: gpus::most_whole_free(&mut tx, key, live_since).await?,
            },
            Want::Share { vram_mb } => NoFit::NoShare { wanted_mb: vram_mb },
        };
        let mut reason = Reason::NoFit(reason).to_string();
        if new.node_filter != crate::NodeFilter::Any {
            let tie = super::volume_mounts::filter_reason(&mut tx, new, live_since).await?;
            reason = format!("{reason}, {tie}");
        }
        let id = new_id();
        let mut batch = Batch::default();
        let caps = super::caps::push_read(&mut batch, &new.tenant_id);
        let answers = batch.run(&mut tx, self.backend).await?;
        admit(&mut tx, self.backend, &answers, caps, new, &quote, &id, at).await?;
        let row = NewRow {
            id: &id,
            new,
            type_name: &type_name,
            quote: &quote,
            host_share_bps: prices.host_share_bps,
            at,
            destination: Destination::Queued { reason: &reason },
            borrowed: false,
        };
        let mut batch = Batch::default();
        let row_part = push_inserts(&mut batch, std::slice::from_ref(&row), false);
        super::volume_mounts::push_mounts(&mut batch, &id, &new.mounts);
        let Some(answers) = unless_replayed(batch.run(&mut tx, self.backend).await)? else {
            return Ok(Attempt::LostRace);
        };
        let reservation = reservation_of(&answers, row_part, &row)?;
        tx.commit().await?;
        tracing::info!(reservation_id = %id, tenant_id = %new.tenant_id, tier = %new.tier, %reason, "queued");
        Ok(Attempt::Done(Box::new(reservation), Vec::new()))
    }
}

/// Why nothing fits `new`: no GPU of its type at all (naming the types there are), or not
/// enough free.
pub(super) async fn no_capacity_reason(
    conn: &mut AnyConnection,
    new: &NewReservation,
    live_since: i64,
) -> Result<StoreError> {
    let wanted = &new.gpu_type;
    let exists: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM gpus WHERE type_key = $1")
        .bind(wanted.key())
        .fetch_one(&mut *conn)
        .await?;
    if exists == 0 {
        let known: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT type_name FROM gpus ORDER BY type_name")
                .fetch_all(&mut *conn)
                .await?;
        return Ok(StoreError::UnknownGpuType {
            wanted: wanted.display().to_owned(),
            known: if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
        });
    }
    Ok(match new.want {
        Want::Whole { count } => {
            let most = gpus::most_whole_free(conn, wanted.key(), live_since).await?;
            StoreError::NoCapacity(format!(
                "asked for {count} whole {wanted} GPUs on one node; the most free on any live node is {}",
                most
            ))
        }
        Want::Share { vram_mb } => StoreError::NoCapacity(format!(
            "no live {wanted} GPU has {vram_mb} MiB of memory free"
        )),
    })
}

/// A count or number as the database keeps it.
fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
