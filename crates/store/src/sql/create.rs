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
use super::ledger::{self, Kind, Transfer};
use super::placement::Attempt;
use super::rows::{fetch_reservation, reservation_fields, reservation_from_row};
use super::{new_id, ts, SqlStore};
use crate::{NewReservation, Result, Scope, StoreError, Want};
use chrono::{DateTime, Utc};

/// The reservation an earlier request with the same `Idempotency-Key` made, if any.
pub(super) async fn earlier_reservation(
    conn: &mut AnyConnection,
    new: &NewReservation,
) -> Result<Option<Reservation>> {
    let Some(key) = &new.idempotency_key else {
        return Ok(None);
    };
    let earlier = sqlx::query(
        "SELECT id, request_hash FROM reservations WHERE tenant_id = $1 AND idempotency_key = $2",
    )
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
    super::caps::check(conn, backend, answers, caps, new, quote.price_per_hour, id).await?;
    take_hold(conn, new, id, quote.hold, at).await
}

/// Prepaid: the first hour (or all of a shorter reservation, or the whole of a reserved block)
/// moves into the tenant's hold, only if the balance covers it.
pub(super) async fn take_hold(
    conn: &mut AnyConnection,
    new: &NewReservation,
    id: &str,
    hold: Money,
    at: i64,
) -> Result<()> {
    let covered = ledger::transfer_covered(
        conn,
        Transfer {
            id: &format!("hold:{id}"),
            debit: &ledger::user_account(&new.tenant_id),
            credit: &ledger::hold_account(&new.tenant_id),
            amount: hold.micros(),
            reservation_id: Some(id),
            at,
            kind: Kind::Hold,
            node_id: None,
        },
    )
    .await?;
    if covered && hold > Money::ZERO {
        return Ok(());
    }
    // Only a refusal (or a hold of nothing, which needs credit left) reads the balance.
    let balance = ledger::balance_of(conn, &ledger::user_account(&new.tenant_id))
        .await?
        .map(Money::from_micros)
        .ok_or_else(|| StoreError::not_found("user", &new.tenant_id))?;
    if !covered || balance <= Money::ZERO {
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
}

/// Adds to `batch` the writing of a new reservation (`pending`, epoch 1), returned as it
/// reads back (nothing else in the transaction changes its row), and of its meter holding
/// `quote.hold`. Returns the answer that holds the reservation's row ([`reservation_of`]).
pub(super) fn push_insert(batch: &mut Batch, row: &NewRow<'_>) -> usize {
    let (new, quote) = (row.new, row.quote);
    let (gpu_count, vram_mb) = count_and_share(new.want);
    let (node_id, node_name, gpus, placed_at, queued_at, reason) = match row.destination {
        Destination::Placed {
            node_id,
            node_name,
            gpus,
        } => (
            Some(node_id),
            Some(node_name),
            gpus,
            Some(row.at),
            None,
            None,
        ),
        Destination::Queued { reason } => (None, None, &[][..], None, Some(row.at), Some(reason)),
    };
    let stepped = quote.rate.step_s < new.duration_s;
    // Read back as `fetch_reservation` reads it: the meter's figures and the node's name
    // are this reservation's own (nothing charged yet, the hold below).
    let row_part = batch.push(
        concat!(
            "INSERT INTO reservations (id, tenant_id, status, gpu_type, gpu_count, vram_mb, tier,
            bid, price_per_hour, duration_s, node_id, gpus, epoch, image, command, env,
            created_at, idempotency_key, request_hash, ports, price_step_s, price_after,
            host_share_bps, priority, placed_at, queued_at, queue_reason, type_key,
            on_node_loss, idle_reclaim, checkpoint, secrets, secret_names, http_ports)
         VALUES ($1, $2, 'pending', $3, $4, $5, $6, $7, $8, $9, $10, $11, 1, $12, $13, $14,
            $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30,
            $31, $32)
         RETURNING ",
            reservation_fields!(),
            ", CAST(0 AS BIGINT) AS charged, CAST($33 AS BIGINT) AS held,
            CAST($34 AS TEXT) AS node_name"
        ),
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
            Arg::from(quote.hold.micros()),
            Arg::from(node_name),
        ],
    );
    batch.push(
        "INSERT INTO meters (reservation_id, tenant_id, node_id, prepaid_block, price_per_hour,
            price_step_s, price_after, duration_s, host_share_bps, charged, held)
         SELECT id, tenant_id, node_id, CASE WHEN tier = 'reserved' THEN 1 ELSE 0 END,
            price_per_hour, price_step_s, price_after, duration_s, host_share_bps, 0, $2
         FROM reservations WHERE id = $1",
        vec![Arg::from(row.id), Arg::from(row.quote.hold.micros())],
    );
    row_part
}

/// The answers of a batch with a [`push_insert`], or `None` when the same Idempotency-Key
/// committed concurrently (the batch failed on it): the next attempt returns that one.
pub(super) fn unless_replayed(answers: Result<Answers>) -> Result<Option<Answers>> {
    match answers {
        Ok(answers) => Ok(Some(answers)),
        Err(e) if e.is_unique_violation() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The reservation [`push_insert`] wrote, its row's answer at `row_part`.
pub(super) fn reservation_of(answers: &Answers, row_part: usize) -> Result<Reservation> {
    let row = answers
        .rows(row_part)
        .first()
        .ok_or_else(|| StoreError::Corrupt("an insert returned no row".to_owned()))?;
    reservation_from_row(row)
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
        let reason = Reason::NoFit(reason).to_string();
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
        };
        let mut batch = Batch::default();
        let row_part = push_insert(&mut batch, &row);
        let Some(answers) = unless_replayed(batch.run(&mut tx, self.backend).await)? else {
            return Ok(Attempt::LostRace);
        };
        let reservation = reservation_of(&answers, row_part)?;
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
