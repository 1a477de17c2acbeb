//! Offers and the reservation lifecycle: placement by compare-and-set, stop, expiry.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_billing::{PriceList, Quote, Size};
use gpurent_sched::{choose_victims, place_expecting, GpuSlot, Placement, Request, Victim};
use gpurent_types::api::{Offer, Reservation, ReservedDiscount};
use gpurent_types::{GpuType, Money, ReservationStatus, Tier};
use sqlx::{AnyConnection, Row};

use super::ledger::{self, Kind, Transfer};
use super::nodes::{adjust_pool, bump_version};
use super::queue::preempt_reservation;
use super::rows::{reservation_from_row, RESERVATION_COLUMNS};
use super::{gib, new_id, retry_transient, switch_of, ts, SqlStore};
use crate::{Backend, NewReservation, ReservationStore, Result, Scope, StoreError, Want};

/// Placement retries after losing a compare-and-set race to another transaction.
const PLACEMENT_ATTEMPTS: usize = 8;
/// The best-fitting GPUs read as candidates for a share.
const SHARE_CANDIDATES: i64 = 16;
/// The best-fitting nodes (fewest whole free GPUs that still hold the request) read as
/// candidates for whole GPUs, with all their GPUs of the type.
const WHOLE_CANDIDATE_NODES: i64 = 3;

fn scope_param(scope: &Scope) -> &str {
    match scope {
        Scope::Tenant(id) => id,
        Scope::All => "",
    }
}

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
        // The balance is read only to refuse: the transfer above already checked it.
        return Ok(());
    }
    let balance = ledger::balance_of(conn, &ledger::user_account(&new.tenant_id))
        .await?
        .map(Money::from_micros)
        .ok_or_else(|| StoreError::not_found("user", &new.tenant_id))?;
    if !covered || (hold == Money::ZERO && balance <= Money::ZERO) {
        return Err(StoreError::InsufficientCredit {
            needed: hold,
            balance,
        });
    }
    Ok(())
}

pub(super) async fn fetch_reservation(
    conn: &mut AnyConnection,
    id: &str,
    scope: &Scope,
) -> Result<Reservation> {
    // Another tenant's reservation is reported as not found, not forbidden.
    let row = sqlx::query(&format!(
        "SELECT {RESERVATION_COLUMNS} WHERE r.id = $1 AND ($2 = '' OR r.tenant_id = $2)"
    ))
    .bind(id)
    .bind(scope_param(scope))
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| StoreError::not_found("reservation", id))?;
    reservation_from_row(&row)
}

struct Candidate {
    uuid: String,
    node_id: String,
    type_name: String,
    type_key: String,
    vram_mb: i64,
}

/// Where a new reservation goes: onto GPUs now, or into the queue.
pub(super) enum Destination<'a> {
    Placed {
        node_id: &'a str,
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
    pub gpu_count: u32,
    /// Set for a share of one GPU.
    pub vram_mb: Option<u64>,
    pub quote: &'a Quote,
    pub host_share_bps: u32,
    pub at: i64,
    pub destination: Destination<'a>,
}

/// Writes a new reservation (`pending`, epoch 1) and its meter holding `quote.hold`. False when
/// the same Idempotency-Key committed concurrently: the next attempt returns that one.
pub(super) async fn insert_reservation(conn: &mut AnyConnection, row: &NewRow<'_>) -> Result<bool> {
    let (new, quote) = (row.new, row.quote);
    let (node_id, gpus, placed_at, queued_at, reason) = match row.destination {
        Destination::Placed { node_id, gpus } => (Some(node_id), gpus, Some(row.at), None, None),
        Destination::Queued { reason } => (None, &[][..], None, Some(row.at), Some(reason)),
    };
    let stepped = quote.rate.step_s < new.duration_s;
    let inserted = sqlx::query(
        "INSERT INTO reservations (id, tenant_id, status, gpu_type, gpu_count, vram_mb, tier,
            bid, price_per_hour, duration_s, node_id, gpus, epoch, image, command, env,
            created_at, idempotency_key, request_hash, ports, price_step_s, price_after,
            host_share_bps, priority, placed_at, queued_at, queue_reason, type_key,
            on_node_loss, idle_reclaim, checkpoint, secrets, secret_names, http_ports)
         VALUES ($1, $2, 'pending', $3, $4, $5, $6, $7, $8, $9, $10, $11, 1, $12, $13, $14,
            $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30,
            $31, $32)",
    )
    .bind(row.id)
    .bind(&new.tenant_id)
    .bind(row.type_name)
    .bind(i64::from(row.gpu_count))
    .bind(row.vram_mb.map(|v| i64::try_from(v).unwrap_or(i64::MAX)))
    .bind(new.tier.as_str())
    .bind((new.tier == Tier::Spot).then_some(quote.price_per_hour.micros()))
    .bind(quote.price_per_hour.micros())
    .bind(i64::try_from(new.duration_s).unwrap_or(i64::MAX))
    .bind(node_id)
    .bind(to_json(&gpus))
    .bind(&new.image)
    .bind(to_json(&new.command))
    .bind(to_json(&new.env))
    .bind(row.at)
    .bind(&new.idempotency_key)
    .bind(&new.request_hash)
    .bind(to_json(&new.ports))
    .bind(stepped.then(|| i64::try_from(quote.rate.step_s).unwrap_or(i64::MAX)))
    .bind(stepped.then_some(quote.rate.then.micros()))
    .bind(i64::from(row.host_share_bps))
    .bind(quote.preemptible().then_some(quote.priority))
    .bind(placed_at)
    .bind(queued_at)
    .bind(reason)
    .bind(new.gpu_type.key())
    .bind(new.on_node_loss.as_str())
    .bind(i64::from(new.idle_reclaim))
    .bind(i64::from(new.checkpoint))
    .bind(&new.sealed_secrets)
    .bind(to_json(&new.secret_names))
    .bind(to_json(&new.http_ports))
    .execute(&mut *conn)
    .await;
    if let Err(e) = inserted {
        let e = StoreError::from(e);
        return if e.is_unique_violation() {
            Ok(false)
        } else {
            Err(e)
        };
    }
    sqlx::query(
        "INSERT INTO meters (reservation_id, tenant_id, node_id, prepaid_block, price_per_hour,
            price_step_s, price_after, duration_s, host_share_bps, charged, held)
         SELECT id, tenant_id, node_id, CASE WHEN tier = 'reserved' THEN 1 ELSE 0 END,
            price_per_hour, price_step_s, price_after, duration_s, host_share_bps, 0, $2
         FROM reservations WHERE id = $1",
    )
    .bind(row.id)
    .bind(quote.hold.micros())
    .execute(&mut *conn)
    .await?;
    Ok(true)
}

pub(super) enum Attempt {
    /// The reservation, and the nodes whose agents must be woken.
    Done(Box<Reservation>, Vec<String>),
    LostRace,
    /// Nothing fits and the request asked to wait: queue it (in a transaction of its own, so
    /// that no preemption tried for it stays behind).
    Queue,
}

/// A placement found: the candidate GPUs read and which of them (and how much of each) to take.
struct Found {
    candidates: Vec<Candidate>,
    placement: Placement,
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

/// The last requests for each GPU type (by type key), newest last: the workload that placement
/// keeps room for (`gpurent_sched::place_expecting`). Kept in memory by each control plane,
/// empty after a restart (placement is then best fit until requests come in again).
#[derive(Debug, Clone, Default)]
pub(crate) struct Recent(Arc<Mutex<HashMap<String, VecDeque<Request>>>>);

/// How many recent requests per GPU type make the expected workload.
const RECENT_REQUESTS: usize = 256;

impl Recent {
    /// The requests seen lately for `type_key`.
    fn expected(&self, type_key: &str) -> Vec<Request> {
        // A panic elsewhere while this was held leaves a list that is still a valid history.
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.get(type_key)
            .map(|list| list.iter().copied().collect())
            .unwrap_or_default()
    }

    fn note(&self, type_key: &str, request: Request) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let list = all.entry(type_key.to_owned()).or_default();
        if list.len() == RECENT_REQUESTS {
            list.pop_front();
        }
        list.push_back(request);
    }
}

fn request_of(want: Want) -> Request {
    match want {
        Want::Whole { count } => Request::Whole { count },
        Want::Share { vram_mb } => Request::Share { vram_mb },
    }
}

impl SqlStore {
    /// Reads the candidate GPUs for `new` and places it; `None` when nothing fits.
    async fn find_placement(
        &self,
        conn: &mut AnyConnection,
        new: &NewReservation,
        live_since: i64,
    ) -> Result<Option<Found>> {
        let rows = match new.want {
            Want::Whole { count } => {
                // The best-fitting live nodes, answered by the index, and their GPUs (the used
                // ones too: they count in the nodes' fragmentation). GPUs of other types are
                // dropped below: with the type in the join, SQLite read every GPU of the type
                // through the type's index for each node (20 ms a placement instead of 0.5).
                let key = new.gpu_type.key();
                let mut rows = sqlx::query(
                    "SELECT g.uuid, g.node_id, g.type_name, g.type_key, g.vram_mb, g.free_mb, g.switch_group
                         FROM (SELECT p.node_id, p.whole_free FROM gpu_pools p
                                   JOIN nodes n ON n.id = p.node_id
                               WHERE p.type_key = $1 AND p.whole_free >= $2
                                 AND n.last_seen_at >= $3 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'
                               ORDER BY p.whole_free, p.node_id LIMIT $4) b
                         JOIN gpus g ON g.node_id = b.node_id
                         ORDER BY b.whole_free, b.node_id, g.idx",
                )
                .bind(key)
                .bind(i64::from(count))
                .bind(live_since)
                .bind(WHOLE_CANDIDATE_NODES)
                .fetch_all(&mut *conn)
                .await?;
                rows.retain(|r| r.try_get::<String, _>("type_key").is_ok_and(|k| k == key));
                rows
            }
            Want::Share { vram_mb } => {
                // The tightest fits first: shared GPUs have less free than whole ones.
                sqlx::query(
                    "SELECT g.uuid, g.node_id, g.type_name, g.type_key, g.vram_mb, g.free_mb, g.switch_group
                     FROM gpus g JOIN nodes n ON n.id = g.node_id
                     WHERE g.type_key = $1 AND g.free_mb >= $2 AND n.last_seen_at >= $3 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'
                     ORDER BY g.free_mb, g.uuid LIMIT $4",
                )
                .bind(new.gpu_type.key())
                .bind(i64::try_from(vram_mb).unwrap_or(i64::MAX))
                .bind(live_since)
                .bind(SHARE_CANDIDATES)
                .fetch_all(&mut *conn)
                .await?
            }
        };
        let mut node_numbers: BTreeMap<String, u32> = BTreeMap::new();
        let mut candidates = Vec::with_capacity(rows.len());
        let mut slots = Vec::with_capacity(rows.len());
        for row in &rows {
            let c = Candidate {
                uuid: row.try_get("uuid")?,
                node_id: row.try_get("node_id")?,
                type_name: row.try_get("type_name")?,
                type_key: row.try_get("type_key")?,
                vram_mb: row.try_get("vram_mb")?,
            };
            let next = u32::try_from(node_numbers.len()).unwrap_or(u32::MAX);
            let node = *node_numbers.entry(c.node_id.clone()).or_insert(next);
            let free_mb: i64 = row.try_get("free_mb")?;
            slots.push(GpuSlot {
                node,
                vram_mb: u64::try_from(c.vram_mb).unwrap_or(0),
                free_mb: u64::try_from(free_mb).unwrap_or(0),
                switch: switch_of(row)?,
            });
            candidates.push(c);
        }
        let request = request_of(new.want);
        let expected = self.recent.expected(new.gpu_type.key());
        Ok(place_expecting(&slots, &request, &expected)
            .ok()
            .filter(|p| !p.gpus.is_empty())
            .map(|placement| Found {
                candidates,
                placement,
            }))
    }

    /// Makes room for `new` by preempting spot instances of lower priority on one node (the
    /// set that loses the least per hour). Their billing stops now; their GPUs go to `new` at
    /// once and their agent gives them `spot_grace_s` seconds of notice. Returns the victims'
    /// node, or `None` when preempting cannot make room.
    async fn preempt_for(
        &self,
        conn: &mut AnyConnection,
        new: &NewReservation,
        prices: &PriceList,
        live_since: i64,
        now: i64,
    ) -> Result<Option<String>> {
        let priority = if new.tier == Tier::Spot {
            let vram: Option<i64> =
                sqlx::query_scalar("SELECT MAX(vram_mb) FROM gpus WHERE type_key = $1")
                    .bind(new.gpu_type.key())
                    .fetch_one(&mut *conn)
                    .await?;
            let Some(vram) = vram else { return Ok(None) };
            let size = size_of(new.want, u64::try_from(vram).unwrap_or(0));
            prices
                .quote(&new.gpu_type, size, new.duration_s, new.tier, new.bid)?
                .priority
        } else {
            i64::MAX
        };
        let held = sqlx::query(
            "SELECT r.id, r.priority, r.price_per_hour, COALESCE(r.started_at, r.created_at) AS since,
                    a.gpu_uuid, a.vram_mb
             FROM reservations r JOIN allocations a ON a.reservation_id = r.id
                  JOIN gpus g ON g.uuid = a.gpu_uuid JOIN nodes n ON n.id = g.node_id
             WHERE r.tier = 'spot' AND r.status IN ('pending', 'starting', 'running')
               AND r.priority < $1 AND g.type_key = $2 AND n.last_seen_at >= $3 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'
             ORDER BY r.id, a.gpu_uuid",
        )
        .bind(priority)
        .bind(new.gpu_type.key())
        .bind(live_since)
        .fetch_all(&mut *conn)
        .await?;
        if held.is_empty() {
            return Ok(None);
        }
        let gpu_rows = sqlx::query(
            "SELECT uuid, node_id, vram_mb, free_mb, switch_group FROM gpus
             WHERE type_key = $1 AND node_id IN (
                SELECT r.node_id FROM reservations r
                WHERE r.tier = 'spot' AND r.status IN ('pending', 'starting', 'running')
                  AND r.priority < $2)
             ORDER BY node_id, idx",
        )
        .bind(new.gpu_type.key())
        .bind(priority)
        .fetch_all(&mut *conn)
        .await?;
        let mut nodes: Vec<String> = Vec::new();
        let mut slot_of: BTreeMap<String, usize> = BTreeMap::new();
        let mut slots = Vec::with_capacity(gpu_rows.len());
        for row in &gpu_rows {
            let node: String = row.try_get("node_id")?;
            let n = nodes.iter().position(|x| *x == node).unwrap_or_else(|| {
                nodes.push(node);
                nodes.len() - 1
            });
            slot_of.insert(row.try_get("uuid")?, slots.len());
            slots.push(GpuSlot {
                node: u32::try_from(n).unwrap_or(u32::MAX),
                vram_mb: u64::try_from(row.try_get::<i64, _>("vram_mb")?).unwrap_or(0),
                free_mb: u64::try_from(row.try_get::<i64, _>("free_mb")?).unwrap_or(0),
                switch: switch_of(row)?,
            });
        }
        let mut ids: Vec<String> = Vec::new();
        let mut victims: Vec<Victim> = Vec::new();
        for row in &held {
            let id: String = row.try_get("id")?;
            let uuid: String = row.try_get("gpu_uuid")?;
            let Some(&slot) = slot_of.get(&uuid) else {
                continue;
            };
            let mb = u64::try_from(row.try_get::<i64, _>("vram_mb")?).unwrap_or(0);
            if ids.last() != Some(&id) {
                ids.push(id);
                victims.push(Victim {
                    priority: row
                        .try_get::<Option<i64>, _>("priority")?
                        .unwrap_or(i64::MAX),
                    value: row.try_get("price_per_hour")?,
                    started_at: row.try_get("since")?,
                    holds: Vec::new(),
                });
            }
            if let Some(v) = victims.last_mut() {
                v.holds.push((slot, mb));
            }
        }
        let Some(chosen) = choose_victims(&slots, &victims, &request_of(new.want), priority)
            .filter(|c| !c.is_empty())
        else {
            return Ok(None);
        };
        let node = victims[chosen[0]]
            .holds
            .first()
            .and_then(|&(slot, _)| {
                nodes.get(usize::try_from(slots[slot].node).unwrap_or(usize::MAX))
            })
            .cloned();
        for &v in &chosen {
            let id = &ids[v];
            // One that ended meanwhile: the placement below finds what it freed, or not.
            if preempt_reservation(conn, id, prices.spot_grace_s, now)
                .await?
                .is_some()
            {
                tracing::info!(reservation_id = %id, by_tenant = %new.tenant_id, "spot instance preempted");
            }
        }
        Ok(node)
    }

    async fn try_reserve(
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

        if self.backend == Backend::Postgres {
            // Placements of one GPU type queue behind each other instead of all choosing the
            // same GPU and losing the compare-and-set to each other. The lock is released at
            // commit or rollback and never expires; the compare-and-set below stays the
            // guarantee that a GPU is never given twice.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                .bind(new.gpu_type.key())
                .execute(&mut *tx)
                .await?;
        }
        let whole_only = i64::from(matches!(new.want, Want::Whole { .. }));
        let mut woken = Vec::new();
        let mut found = self.find_placement(&mut tx, new, live_since).await?;
        if found.is_none() {
            // Full: work that outranks some spot instances takes their GPUs.
            if let Some(node) = self
                .preempt_for(&mut tx, new, prices, live_since, at)
                .await?
            {
                woken.push(node);
                found = self.find_placement(&mut tx, new, live_since).await?;
            }
        }
        let Some(Found {
            candidates,
            placement,
        }) = found
        else {
            let err = self.no_capacity_reason(&mut tx, new, live_since).await?;
            if new.queue && matches!(err, StoreError::NoCapacity(_)) {
                return Ok(Attempt::Queue);
            }
            return Err(err);
        };
        let Some(&(first, _)) = placement.gpus.first() else {
            return Err(StoreError::NoCapacity("empty placement".to_owned()));
        };
        let first = &candidates[first];
        let node_id = first.node_id.clone();
        let gpu_vram = u64::try_from(first.vram_mb).unwrap_or(0);
        let quote = prices.quote(
            &new.gpu_type,
            size_of(new.want, gpu_vram),
            new.duration_s,
            new.tier,
            new.bid,
        )?;
        let (gpu_count, vram_mb) = match new.want {
            Want::Whole { count } => (count, None),
            Want::Share { vram_mb } => (1, Some(vram_mb)),
        };

        let id = new_id();
        super::caps::check_caps(&mut tx, &new.tenant_id, &new.limits, quote.price_per_hour).await?;
        take_hold(&mut tx, new, &id, quote.hold, at).await?;

        // The compare-and-set: memory only moves if it is still free. Losing means another
        // transaction took it since we read; start over from a fresh read.
        for &(i, mb) in &placement.gpus {
            let mb = i64::try_from(mb).unwrap_or(i64::MAX);
            let used: Option<i64> = sqlx::query_scalar(
                "UPDATE gpus SET free_mb = free_mb - $1
                 WHERE uuid = $2 AND free_mb >= $1 AND ($3 = 0 OR free_mb = vram_mb)
                 RETURNING vram_mb - free_mb",
            )
            .bind(mb)
            .bind(&candidates[i].uuid)
            .bind(whole_only)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(used) = used else {
                return Ok(Attempt::LostRace);
            };
            if used == mb {
                // It was whole and free until now.
                let c = &candidates[i];
                adjust_pool(&mut tx, &c.node_id, &c.type_key, -1).await?;
            }
        }

        let gpu_uuids: Vec<&str> = placement
            .gpus
            .iter()
            .map(|&(i, _)| candidates[i].uuid.as_str())
            .collect();
        let row = NewRow {
            id: &id,
            new,
            type_name: &first.type_name,
            gpu_count,
            vram_mb,
            quote: &quote,
            host_share_bps: prices.host_share_bps,
            at,
            destination: Destination::Placed {
                node_id: &node_id,
                gpus: &gpu_uuids,
            },
        };
        if !insert_reservation(&mut tx, &row).await? {
            return Ok(Attempt::LostRace);
        }
        for &(i, mb) in &placement.gpus {
            sqlx::query(
                "INSERT INTO allocations (reservation_id, gpu_uuid, vram_mb) VALUES ($1, $2, $3)",
            )
            .bind(&id)
            .bind(&candidates[i].uuid)
            .bind(i64::try_from(mb).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        }
        if !woken.contains(&node_id) {
            woken.push(node_id.clone());
        }
        woken.sort();
        for node in &woken {
            bump_version(&mut tx, node).await?;
        }
        let reservation = fetch_reservation(&mut tx, &id, &Scope::All).await?;
        tx.commit().await?;
        tracing::info!(reservation_id = %id, node_id = %node_id, tenant_id = %new.tenant_id, tier = %new.tier, "reserved");
        Ok(Attempt::Done(Box::new(reservation), woken))
    }

    pub(super) async fn no_capacity_reason(
        &self,
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
                let most: Option<i64> = sqlx::query_scalar(
                    "SELECT MAX(p.whole_free) FROM gpu_pools p JOIN nodes n ON n.id = p.node_id
                     WHERE p.type_key = $1 AND n.last_seen_at >= $2 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'",
                )
                .bind(wanted.key())
                .bind(live_since)
                .fetch_one(&mut *conn)
                .await?;
                StoreError::NoCapacity(format!(
                    "asked for {count} whole {wanted} GPUs on one node; the most free on any live node is {}",
                    most.unwrap_or(0)
                ))
            }
            Want::Share { vram_mb } => StoreError::NoCapacity(format!(
                "no live {wanted} GPU has {vram_mb} MiB of memory free"
            )),
        })
    }
}

/// A reservation that stops running stops being settled: `finish` charges the rest when its
/// agent confirms.
pub(crate) async fn stop_meter(conn: &mut AnyConnection, reservation_id: &str) -> Result<()> {
    sqlx::query("UPDATE meters SET settled_until = NULL WHERE reservation_id = $1")
        .bind(reservation_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Serialises the small JSON columns (GPU list, command, env); these types cannot fail to.
pub(super) fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

#[async_trait]
impl ReservationStore for SqlStore {
    async fn offers(&self, prices: &PriceList, live_since: DateTime<Utc>) -> Result<Vec<Offer>> {
        let rows = sqlx::query(
            "SELECT g.type_name, g.type_key, MAX(g.vram_mb) AS vram_mb,
                    CAST(SUM(CASE WHEN g.free_mb = g.vram_mb AND n.last_seen_at >= $1 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'
                             THEN 1 ELSE 0 END) AS BIGINT) AS available,
                    CAST(SUM(CASE WHEN g.free_mb = g.vram_mb AND n.last_seen_at >= $1 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready' AND n.isolated = 0
                             THEN 1 ELSE 0 END) AS BIGINT) AS unisolated
             FROM gpus g JOIN nodes n ON n.id = g.node_id
             GROUP BY g.type_name, g.type_key ORDER BY g.type_name",
        )
        .bind(ts(live_since))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let name: String = r.try_get("type_name")?;
                let vram_mb: i64 = r.try_get("vram_mb")?;
                let gpu_vram_mb = u64::try_from(vram_mb).unwrap_or(0);
                let gpu_type = GpuType::from_driver_name(&name);
                let one = Size::Whole {
                    count: 1,
                    gpu_vram_mb,
                };
                let stepped = prices.stepped_rate(&gpu_type, one)?;
                Ok(Offer {
                    vram_gb: gib(vram_mb),
                    vram_mb: gpu_vram_mb,
                    available: u32::try_from(r.try_get::<i64, _>("available")?).unwrap_or(0),
                    unisolated: u32::try_from(r.try_get::<i64, _>("unisolated")?).unwrap_or(0),
                    price_per_hour: prices.on_demand_per_hour(&gpu_type, one)?,
                    spot_min_bid: prices.spot_min_bid(&gpu_type, one)?,
                    stepped_price_per_hour: stepped.first,
                    stepped_first_hours: u32::try_from(stepped.step_s / 3600).unwrap_or(u32::MAX),
                    stepped_then_per_hour: stepped.then,
                    share_price_per_gb_hour: prices.on_demand_per_hour(
                        &gpu_type,
                        Size::Share {
                            vram_mb: 1024,
                            gpu_vram_mb,
                        },
                    )?,
                    reserved_discounts: prices
                        .reserved_prices(&gpu_type, one)?
                        .into_iter()
                        .map(|(min_hours, percent, price_per_hour)| ReservedDiscount {
                            min_hours,
                            percent,
                            price_per_hour,
                        })
                        .collect(),
                    currency: prices.currency().to_owned(),
                    gpu_type: name,
                })
            })
            .collect()
    }

    async fn gpu_vram_mb(&self, gpu_type: &GpuType) -> Result<Option<u64>> {
        let vram: Option<i64> =
            sqlx::query_scalar("SELECT MAX(vram_mb) FROM gpus WHERE type_key = $1")
                .bind(gpu_type.key())
                .fetch_one(&self.pool)
                .await?;
        Ok(vram.and_then(|v| u64::try_from(v).ok()))
    }

    async fn reserve(
        &self,
        new: NewReservation,
        prices: &PriceList,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(Reservation, Vec<String>)> {
        // Asked, whether or not it fits: the demand placement keeps room for next time.
        self.recent.note(new.gpu_type.key(), request_of(new.want));
        for _ in 0..PLACEMENT_ATTEMPTS {
            let attempt = retry_transient("reserve", || {
                self.try_reserve(&new, prices, ts(live_since), now)
            });
            let attempt = match attempt.await? {
                Attempt::Queue => {
                    retry_transient("enqueue", || {
                        self.try_enqueue(&new, prices, ts(live_since), now)
                    })
                    .await?
                }
                other => other,
            };
            match attempt {
                Attempt::Done(r, nodes) => return Ok((*r, nodes)),
                Attempt::LostRace => continue,
                Attempt::Queue => {
                    return Err(StoreError::NoCapacity(
                        "the reservation could not be queued".to_owned(),
                    ))
                }
            }
        }
        Err(StoreError::Conflict(
            "too many concurrent reservations for the same GPUs; retry".to_owned(),
        ))
    }

    async fn get_reservation(&self, id: &str, scope: &Scope) -> Result<Reservation> {
        let mut conn = self.pool.acquire().await?;
        fetch_reservation(&mut conn, id, scope).await
    }

    async fn list_reservations(
        &self,
        scope: &Scope,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Vec<Reservation>> {
        // Newest first; the cursor is the last reservation of the previous page, looked up in
        // the caller's scope: another tenant's id answers an empty page, as an unknown one, so
        // a cursor cannot probe which ids exist.
        sqlx::query(&format!(
            "SELECT {RESERVATION_COLUMNS} WHERE ($1 = '' OR r.tenant_id = $1)
               AND ($2 = '' OR r.created_at < (SELECT c.created_at FROM reservations c
                                               WHERE c.id = $2 AND ($1 = '' OR c.tenant_id = $1))
                    OR (r.created_at = (SELECT c.created_at FROM reservations c
                                        WHERE c.id = $2 AND ($1 = '' OR c.tenant_id = $1))
                        AND r.id > $2))
             ORDER BY r.created_at DESC, r.id LIMIT $3"
        ))
        .bind(scope_param(scope))
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit.min(1000)))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(reservation_from_row)
        .collect()
    }

    async fn read_logs(
        &self,
        id: &str,
        scope: &Scope,
        offset: u64,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, u64)> {
        let mut conn = self.pool.acquire().await?;
        fetch_reservation(&mut conn, id, scope).await?;
        super::logs::read(&mut conn, id, offset, max_bytes).await
    }

    async fn append_log_note(&self, reservation_id: &str, line: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        super::logs::note(&mut tx, reservation_id, line).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn prune_logs(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut tx = self.begin().await?;
        let pruned = super::logs::prune(&mut tx, ts(before)).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn request_stop(
        &self,
        id: &str,
        scope: &Scope,
        now: DateTime<Utc>,
    ) -> Result<(Reservation, Option<String>)> {
        let mut tx = self.begin().await?;
        let current = fetch_reservation(&mut tx, id, scope).await?;
        let stoppable = matches!(
            current.status,
            ReservationStatus::Pending | ReservationStatus::Starting | ReservationStatus::Running
        );
        if !stoppable {
            return Ok((current, None));
        }
        // A queued reservation has nothing to stop: it ends here, its hold released.
        if current.status == ReservationStatus::Pending && current.node.is_none() {
            if let Some(ended) = self.stop_queued(&mut tx, id, scope, ts(now)).await? {
                tx.commit().await?;
                return Ok((ended, None));
            }
        }
        // A stop asked after the reservation's hours were up (before the expiry pass got to
        // it) is its expiry.
        let node_id: Option<String> = sqlx::query_scalar::<_, Option<String>>(
            "UPDATE reservations SET status = 'stopping',
                end_reason = CASE WHEN started_at + duration_s * 1000000 <= $1
                    THEN 'expired' ELSE 'stopped_by_user' END,
                stop_requested_at = CASE WHEN started_at + duration_s * 1000000 <= $1
                    THEN started_at + duration_s * 1000000 ELSE $1 END
             WHERE id = $2 AND status = $3 RETURNING node_id",
        )
        .bind(ts(now))
        .bind(id)
        .bind(current.status.as_str())
        .fetch_optional(&mut *tx)
        .await?
        .flatten();
        stop_meter(&mut tx, id).await?;
        if let Some(node) = &node_id {
            bump_version(&mut tx, node).await?;
        }
        let updated = fetch_reservation(&mut tx, id, scope).await?;
        tx.commit().await?;
        Ok((updated, node_id))
    }

    async fn expire_due(&self, now: DateTime<Utc>) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let due = sqlx::query(
            "SELECT id, node_id FROM reservations
             WHERE status = 'running' AND started_at + duration_s * 1000000 <= $1 ORDER BY id",
        )
        .bind(ts(now))
        .fetch_all(&mut *tx)
        .await?;
        let mut nodes = Vec::new();
        for row in due {
            let id: String = row.try_get("id")?;
            let node: Option<String> = row.try_get("node_id")?;
            sqlx::query(
                "UPDATE reservations SET status = 'stopping', end_reason = 'expired',
                    stop_requested_at = started_at + duration_s * 1000000
                 WHERE id = $1 AND status = 'running'",
            )
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            stop_meter(&mut tx, &id).await?;
            tracing::info!(reservation_id = %id, "reservation expired");
            if let Some(node) = node {
                if !nodes.contains(&node) {
                    nodes.push(node);
                }
            }
        }
        // Nodes last, as in every transaction (see `sync_once`).
        nodes.sort();
        for node in &nodes {
            bump_version(&mut tx, node).await?;
        }
        tx.commit().await?;
        Ok(nodes)
    }

    async fn touch_reservation(&self, id: &str, at: DateTime<Utc>) -> Result<()> {
        sqlx::query(
            "UPDATE reservations SET last_active_at = $2
             WHERE id = $1 AND status = 'running'
               AND (last_active_at IS NULL OR last_active_at < $2)",
        )
        .bind(id)
        .bind(ts(at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn reclaim_idle(
        &self,
        idle_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let due = sqlx::query(
            "SELECT id, node_id FROM reservations
             WHERE status = 'running' AND idle_reclaim <> 0
               AND CASE WHEN last_active_at IS NULL OR last_active_at < started_at
                        THEN started_at ELSE last_active_at END <= $1
             ORDER BY id",
        )
        .bind(ts(idle_since))
        .fetch_all(&mut *tx)
        .await?;
        let mut nodes = Vec::new();
        for row in due {
            let id: String = row.try_get("id")?;
            let node: Option<String> = row.try_get("node_id")?;
            let stopped = sqlx::query(
                "UPDATE reservations SET status = 'stopping', end_reason = 'idle',
                    stop_requested_at = $1
                 WHERE id = $2 AND status = 'running'",
            )
            .bind(ts(now))
            .bind(&id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if stopped == 0 {
                continue;
            }
            stop_meter(&mut tx, &id).await?;
            tracing::info!(reservation_id = %id, "reservation stopped: its GPUs were idle");
            if let Some(node) = node {
                if !nodes.contains(&node) {
                    nodes.push(node);
                }
            }
        }
        // Nodes last, as in every transaction (see `sync_once`).
        nodes.sort();
        for node in &nodes {
            bump_version(&mut tx, node).await?;
        }
        tx.commit().await?;
        Ok(nodes)
    }

    async fn settle_due(
        &self,
        now: DateTime<Utc>,
        period: std::time::Duration,
    ) -> Result<crate::Settled> {
        SqlStore::settle_due(self, now, period).await
    }

    async fn queue_view(
        &self,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<crate::QueueView> {
        self.read_queue(ts(live_since), ts(now)).await
    }

    async fn place_queued(
        &self,
        placement: &crate::QueuedPlacement,
        prices: &PriceList,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<String>>> {
        self.place_queued_retrying(placement, prices, now).await
    }

    async fn note_queue_reasons(&self, reasons: &[(String, String)]) -> Result<()> {
        retry_transient("note_queue_reasons", || self.write_queue_reasons(reasons)).await
    }

    async fn end_queue_timeouts(
        &self,
        queued_before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>> {
        retry_transient("end_queue_timeouts", || {
            self.end_timed_out(ts(queued_before), ts(now))
        })
        .await
    }

    async fn allocation_problems(&self) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        let gpus = sqlx::query(
            // A missing GPU has nothing free and should have nothing allocated.
            "SELECT g.uuid, CASE WHEN g.missing_since IS NULL THEN g.vram_mb - g.free_mb
                    ELSE g.free_mb END AS used,
                    CAST(COALESCE((SELECT SUM(a.vram_mb) FROM allocations a WHERE a.gpu_uuid = g.uuid), 0)
                         AS BIGINT) AS allocated
             FROM gpus g",
        )
        .fetch_all(&self.pool)
        .await?;
        for g in gpus {
            let used: i64 = g.try_get("used")?;
            let allocated: i64 = g.try_get("allocated")?;
            if used != allocated {
                let uuid: String = g.try_get("uuid")?;
                problems.push(format!(
                    "GPU {uuid}: {used} MiB taken but {allocated} MiB allocated"
                ));
            }
        }
        let pools = sqlx::query(
            "SELECT p.node_id, p.type_key, p.whole_free,
                    (SELECT COUNT(*) FROM gpus g WHERE g.node_id = p.node_id
                        AND g.type_key = p.type_key AND g.free_mb = g.vram_mb) AS counted
             FROM gpu_pools p",
        )
        .fetch_all(&self.pool)
        .await?;
        for p in pools {
            let (cached, counted): (i64, i64) = (p.try_get("whole_free")?, p.try_get("counted")?);
            if cached != counted {
                let node: String = p.try_get("node_id")?;
                let key: String = p.try_get("type_key")?;
                problems.push(format!(
                    "node {node}: {cached} whole free {key} GPUs recorded, {counted} counted"
                ));
            }
        }
        let orphans: Vec<String> = sqlx::query_scalar(
            "SELECT a.reservation_id FROM allocations a JOIN reservations r ON r.id = a.reservation_id
             WHERE r.status IN ('stopped', 'failed', 'preempted', 'lost', 'expired')",
        )
        .fetch_all(&self.pool)
        .await?;
        problems.extend(
            orphans
                .into_iter()
                .map(|id| format!("ended reservation {id} still holds GPUs")),
        );
        let unplaced: Vec<String> = sqlx::query_scalar(
            "SELECT r.id FROM reservations r
             WHERE r.status IN ('pending', 'starting', 'running', 'stopping')
               AND NOT (r.status = 'stopping' AND r.end_reason = 'preempted')
               AND NOT (r.status = 'pending' AND r.node_id IS NULL)
               AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.reservation_id = r.id)",
        )
        .fetch_all(&self.pool)
        .await?;
        problems.extend(
            unplaced
                .into_iter()
                .map(|id| format!("live reservation {id} holds no GPU")),
        );
        Ok(problems)
    }
}
