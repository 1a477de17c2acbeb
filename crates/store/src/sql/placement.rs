//! Placement, committed: a reservation's plan (made by `gpurent_sched::plan` from the
//! candidates read in the same transaction, or by the queue's pass) applied in one
//! transaction: its victims preempted, its GPU memory taken by compare-and-set, its hold and
//! the nodes' desired versions. A plan made from a stale view rolls back whole; an immediate
//! placement then plans again from a fresh read.

use chrono::{DateTime, Utc};
use gpurent_billing::PriceList;
use gpurent_sched::plan::{tier_priority, Ask, View};
use gpurent_sched::quota::Standing;
use gpurent_sched::{Plan, Request};
use gpurent_types::api::Reservation;
use gpurent_types::Tier;
use sqlx::AnyConnection;

use super::batch::{Arg, Batch};
use super::create::{
    admit, earlier_reservation, no_capacity_reason, push_inserts, quote_of, reservation_of,
    to_json, unless_replayed, Destination, NewRow,
};
use super::gpus::{self, Claims, Lock};
use super::queue::preempt_reservation;
use super::{new_id, retry_transient, ts, Backend, SqlStore};
use crate::{NewReservation, NodeFilter, Result, StoreError};

/// Plans made again after losing a compare-and-set race to another transaction.
const PLACEMENT_ATTEMPTS: usize = 8;

pub(super) enum Attempt {
    /// The reservation (placed, queued, or the replay of an earlier request with its
    /// Idempotency-Key), and the nodes whose agents must be woken.
    Done(Box<Reservation>, Vec<String>),
    /// The plan was stale, or the same Idempotency-Key committed meanwhile: nothing was kept.
    LostRace,
    /// Nothing fits and the request asked to wait: queue it (in a transaction of its own, so
    /// that nothing tried for the placement stays behind).
    Queue,
}

/// Preempts `plan`'s victims, then adds to `batch` the taking of its GPU memory for
/// `reservation_id` and the bump of the desired version of every node that changed (sorted,
/// and last, as in every transaction). Returns the claims, to check once the batch ran, and
/// the nodes to wake.
async fn apply(
    conn: &mut AnyConnection,
    backend: Backend,
    batch: &mut Batch,
    reservation_id: &str,
    plan: &Plan,
    grace_s: u64,
    now: i64,
) -> Result<(Claims, Vec<String>)> {
    let mut woken = vec![plan.node_id.clone()];
    for victim in &plan.victims {
        // One that ended meanwhile freed its memory anyway; the compare-and-set decides.
        if let Some(node) = preempt_reservation(conn, victim, grace_s, now).await? {
            tracing::info!(reservation_id = %victim, by = %reservation_id, "spot instance preempted");
            if !woken.contains(&node) {
                woken.push(node);
            }
        }
    }
    let claims = gpus::push_claims(batch, &[(reservation_id, plan)]);
    push_bumps(batch, backend, woken.clone());
    woken.sort();
    Ok((claims, woken))
}

/// Adds to `batch` the bump of the desired version of each of `nodes` (once each, whatever
/// their repeats), locked in id order as every transaction locks nodes, so that two cannot
/// deadlock: their agents' long polls answer with the change.
pub(super) fn push_bumps(batch: &mut Batch, backend: Backend, mut nodes: Vec<String>) {
    nodes.sort();
    nodes.dedup();
    if nodes.is_empty() {
        return;
    }
    let ids = super::batch::placeholders(1, nodes.len());
    let sql = match backend {
        Backend::Postgres => format!(
            "UPDATE nodes SET desired_version = desired_version + 1 WHERE id IN (
                SELECT id FROM nodes WHERE id IN ({ids}) ORDER BY id FOR UPDATE)"
        ),
        Backend::Sqlite => {
            format!("UPDATE nodes SET desired_version = desired_version + 1 WHERE id IN ({ids})")
        }
    };
    batch.push(sql, nodes.into_iter().map(Arg::from).collect());
}

/// The priority `new` plans with: a spot bid per whole GPU-hour as its quote gives it (sized
/// against the largest GPU of the type), or its tier's.
async fn ask_priority(
    conn: &mut AnyConnection,
    new: &NewReservation,
    prices: &PriceList,
) -> Result<Option<i64>> {
    if new.tier != Tier::Spot {
        return Ok(Some(tier_priority(new.tier, None, false)));
    }
    let Some((vram, _, _)) = gpus::largest(conn, new.gpu_type.key()).await? else {
        return Ok(None);
    };
    let quote = quote_of(prices, new, vram)?;
    Ok(Some(tier_priority(new.tier, Some(quote.priority), false)))
}

/// A plan for a new reservation, with what its row records of the GPUs it takes.
struct Planned {
    plan: Plan,
    /// The GPU model's name as the node reported it.
    type_name: String,
    /// The name of the plan's node.
    node_name: String,
    /// The memory of the plan's first GPU: what a share is sized against.
    card_vram_mb: u64,
}

/// The plan of `ask` on these candidates, with the names of what it took; None when it does not
/// fit there.
fn planned(found: gpus::Candidates, ask: &Ask, expected: &[Request]) -> Option<Planned> {
    let view = View {
        gpus: found.gpus,
        work: Vec::new(),
    };
    let plan = gpurent_sched::plan(&view, ask, expected).ok()?;
    let first = view
        .gpus
        .iter()
        .position(|g| Some(&g.uuid) == plan.gpus.first().map(|(u, _)| u));
    Some(Planned {
        card_vram_mb: first.map_or(0, |i| view.gpus[i].vram_mb),
        type_name: first
            .map(|i| found.type_names[i].clone())
            .unwrap_or_default(),
        node_name: first
            .map(|i| found.node_names[i].clone())
            .unwrap_or_default(),
        plan,
    })
}

impl SqlStore {
    /// `reserve`: plans `new` against the expected workload and applies the plan, planning
    /// again from a fresh read when it went stale; queues it when nothing fits and it asked to
    /// wait.
    pub(super) async fn reserve_planned(
        &self,
        new: &NewReservation,
        prices: &PriceList,
        live_since: i64,
        now: DateTime<Utc>,
        expected: &[Request],
    ) -> Result<(Reservation, Vec<String>)> {
        for _ in 0..PLACEMENT_ATTEMPTS {
            let attempt = retry_transient("reserve", || {
                self.try_reserve(new, prices, live_since, now, expected)
            });
            let attempt = match attempt.await? {
                Attempt::Queue => {
                    retry_transient("enqueue", || self.try_enqueue(new, prices, live_since, now))
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

    /// Reads the candidates for `new` and plans it: on free memory, else by preempting spot
    /// work of lower priority.
    async fn plan_new(
        &self,
        conn: &mut AnyConnection,
        new: &NewReservation,
        prices: &PriceList,
        live_since: i64,
        expected: &[Request],
        standing: Standing,
    ) -> Result<Option<Planned>> {
        let key = new.gpu_type.key();
        let first_ask = Ask {
            request: new.want,
            priority: tier_priority(new.tier, None, false),
        };
        // On PostgreSQL, nodes another placement is deciding on are passed over; when they
        // were all taken, wait for them and read what they left.
        let locks: &[Lock] = match self.backend {
            Backend::Postgres => &[Lock::SkipLocked, Lock::Wait],
            Backend::Sqlite => &[Lock::Wait],
        };
        for &lock in locks {
            // Spread (an endpoint's replicas): first on the nodes it should avoid not, among
            // every node's GPUs of the type.
            if !new.avoid_nodes.is_empty() && new.node_filter == NodeFilter::Any {
                let mut spread = super::volume_mounts::filtered_candidates(
                    conn,
                    self.backend,
                    key,
                    live_since,
                    &NodeFilter::Any,
                )
                .await?;
                spread.retain_nodes(|node| !new.avoid_nodes.iter().any(|a| a == node));
                if let Some(planned) = planned(spread, &first_ask, expected) {
                    return Ok(Some(planned));
                }
            }
            let found = if new.node_filter == NodeFilter::Any {
                gpus::candidates(conn, self.backend, key, new.want, live_since, lock).await?
            } else {
                super::volume_mounts::filtered_candidates(
                    conn,
                    self.backend,
                    key,
                    live_since,
                    &new.node_filter,
                )
                .await?
            };
            let mut found = found;
            // Among equal fits, a node that has the image (its pull is saved).
            if let Some(image) = &new.image {
                found.prefer_nodes(&super::node_images::having(conn, image).await?);
            }
            if let Some(planned) = planned(found, &first_ask, expected) {
                return Ok(Some(planned));
            }
        }
        // Full: work that outranks some spot instances takes their GPUs.
        let Some(priority) = ask_priority(conn, new, prices).await? else {
            return Ok(None);
        };
        let guaranteed = (standing == Standing::Guaranteed).then_some(new.tenant_id.as_str());
        let mut view = gpus::preemptible(conn, key, priority, live_since, guaranteed).await?;
        match &new.node_filter {
            NodeFilter::Any => {}
            NodeFilter::Node(node) => view.gpus.retain(|g| g.node_id == *node),
            NodeFilter::SharedVolumes => {
                let shared = super::volume_mounts::shared_nodes(conn).await?;
                view.gpus.retain(|g| shared.contains(&g.node_id));
            }
        }
        if view.work.is_empty() || view.gpus.is_empty() {
            return Ok(None);
        }
        let ask = Ask {
            request: new.want,
            priority,
        };
        let Ok(plan) = gpurent_sched::plan(&view, &ask, expected) else {
            return Ok(None);
        };
        let first = view
            .gpus
            .iter()
            .find(|g| Some(&g.uuid) == plan.gpus.first().map(|(u, _)| u));
        let type_name = gpus::largest(conn, key)
            .await?
            .map(|(_, name, _)| name)
            .unwrap_or_default();
        let node_name = gpus::node_name(conn, &plan.node_id).await?;
        Ok(Some(Planned {
            card_vram_mb: first.map_or(0, |g| g.vram_mb),
            type_name,
            node_name,
            plan,
        }))
    }

    async fn try_reserve(
        &self,
        new: &NewReservation,
        prices: &PriceList,
        live_since: i64,
        now: DateTime<Utc>,
        expected: &[Request],
    ) -> Result<Attempt> {
        let at = ts(now);
        let mut tx = self.begin().await?;
        if let Some(r) = earlier_reservation(&mut tx, new).await? {
            return Ok(Attempt::Done(Box::new(r), Vec::new()));
        }
        // Past its quota and borrow limit: refused, or queued when it asked to wait.
        let standing = match super::quotas::standing_of(&mut tx, self.backend, new).await {
            Err(StoreError::LimitExceeded(_)) if new.queue => return Ok(Attempt::Queue),
            other => other?,
        };
        super::volume_mounts::claim(&mut tx, self.backend, new).await?;
        let Some(Planned {
            plan,
            type_name,
            node_name,
            card_vram_mb,
        }) = self
            .plan_new(&mut tx, new, prices, live_since, expected, standing)
            .await?
        else {
            let err = match no_capacity_reason(&mut tx, new, live_since).await? {
                StoreError::NoCapacity(why) if new.node_filter != NodeFilter::Any => {
                    let tie = super::volume_mounts::filter_reason(&mut tx, new, live_since).await?;
                    StoreError::NoCapacity(format!("{why}, {tie}"))
                }
                other => other,
            };
            if new.queue && matches!(err, StoreError::NoCapacity(_)) {
                return Ok(Attempt::Queue);
            }
            return Err(err);
        };
        let quote = quote_of(prices, new, card_vram_mb)?;
        let id = new_id();
        let gpu_uuids: Vec<&str> = plan.gpus.iter().map(|(u, _)| u.as_str()).collect();
        let borrowed = standing == Standing::Borrowed;
        let row = NewRow {
            id: &id,
            new,
            type_name: &type_name,
            quote: &quote,
            host_share_bps: prices.host_share_bps,
            at,
            destination: Destination::Placed {
                node_id: &plan.node_id,
                node_name: &node_name,
                gpus: &gpu_uuids,
            },
            borrowed,
        };
        // One batch: the row and meter, the claims, the versions, and the tenant's caps.
        let mut batch = Batch::default();
        let row_part = push_inserts(&mut batch, std::slice::from_ref(&row), false);
        super::volume_mounts::push_mounts(&mut batch, &id, &new.mounts);
        let (claims, woken) = apply(
            &mut tx,
            self.backend,
            &mut batch,
            &id,
            &plan,
            prices.spot_grace_s,
            at,
        )
        .await?;
        if standing != Standing::Unmanaged {
            super::quota_use::push_use(&mut batch, &[(new.tenant_id.as_str(), &plan)]);
        }
        let caps = super::caps::push_read(&mut batch, &new.tenant_id);
        let Some(answers) = unless_replayed(batch.run(&mut tx, self.backend).await)? else {
            return Ok(Attempt::LostRace);
        };
        if !claims.held(&answers) {
            return Ok(Attempt::LostRace);
        }
        let reservation = reservation_of(&answers, row_part, &row)?;
        admit(&mut tx, self.backend, &answers, caps, new, &quote, &id, at).await?;
        tx.commit().await?;
        tracing::info!(reservation_id = %id, node_id = %plan.node_id, tenant_id = %new.tenant_id, tier = %new.tier, "reserved");
        Ok(Attempt::Done(Box::new(reservation), woken))
    }

    /// `place_queued`: applies a scheduling pass's `plan` for queued reservation `id`; `None`
    /// (nothing kept) when the reservation is no longer queued or the plan went stale.
    pub(super) async fn place_queued_planned(
        &self,
        id: &str,
        plan: &Plan,
        prices: &PriceList,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<String>>> {
        retry_transient("place_queued", || {
            self.try_place_queued(id, plan, prices.spot_grace_s, ts(now))
        })
        .await
    }

    async fn try_place_queued(
        &self,
        id: &str,
        plan: &Plan,
        grace_s: u64,
        now: i64,
    ) -> Result<Option<Vec<String>>> {
        let mut tx = self.begin().await?;
        // Its tenant's monthly budget is spent: it waits, saying why, until the month ends or
        // the budget is raised.
        let over: Option<String> = sqlx::query_scalar(
            "SELECT u.over_budget FROM reservations r JOIN users u ON u.id = r.tenant_id
             WHERE r.id = $1",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .flatten();
        let month = gpurent_billing::budget::month_of(super::from_ts(now)?).2;
        if over.as_deref() == Some(month.as_str()) {
            sqlx::query("UPDATE reservations SET queue_reason = $1 WHERE id = $2")
                .bind(format!(
                    "waiting: its tenant's monthly budget is spent for {month}"
                ))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            return Ok(None);
        }
        // Past its tenant's quota and borrow limit (a quota lowered under it, say): it waits,
        // saying why.
        let key = gpus::type_of(&mut tx, plan.gpus.first().map_or("", |(u, _)| u.as_str())).await?;
        let (standing, tenant) =
            match super::quotas::standing_of_queued(&mut tx, self.backend, id, &key).await {
                Err(StoreError::LimitExceeded(why)) => {
                    sqlx::query("UPDATE reservations SET queue_reason = $1 WHERE id = $2")
                        .bind(format!("waiting: {why}"))
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    return Ok(None);
                }
                other => other?,
            };
        // The pass's victims are still what it may stop: its standing may have changed since
        // the view (another of its tenant's placements came first).
        if !plan.victims.is_empty() {
            let guaranteed = standing == Standing::Guaranteed;
            if !super::quotas::may_stop(&mut tx, &tenant, &plan.victims, guaranteed).await? {
                return Ok(None);
            }
        }
        let mut batch = Batch::default();
        if standing == Standing::Borrowed {
            batch.push(
                "UPDATE reservations SET borrowed = 1 WHERE id = $1",
                vec![Arg::from(id)],
            );
        }
        // The claim is a compare-and-set on the row: a stop or a timeout of the same
        // reservation waits for this transaction, then finds it placed (or the other way round).
        let gpu_uuids: Vec<&str> = plan.gpus.iter().map(|(u, _)| u.as_str()).collect();
        let claimed = batch.push(
            "UPDATE reservations SET node_id = $1, gpus = $2, placed_at = $3, queue_reason = NULL
             WHERE id = $4 AND status = 'pending' AND node_id IS NULL",
            vec![
                Arg::from(&plan.node_id),
                Arg::from(to_json(&gpu_uuids)),
                Arg::from(now),
                Arg::from(id),
            ],
        );
        batch.push(
            "UPDATE meters SET node_id = $1 WHERE reservation_id = $2",
            vec![Arg::from(&plan.node_id), Arg::from(id)],
        );
        let (claims, woken) =
            apply(&mut tx, self.backend, &mut batch, id, plan, grace_s, now).await?;
        if standing != Standing::Unmanaged {
            super::quota_use::push_use(&mut batch, &[(tenant.as_str(), plan)]);
        }
        let answers = batch.run(&mut tx, self.backend).await?;
        if answers.affected(claimed) != 1 || !claims.held(&answers) {
            // No longer queued, or a stale view: the memory went elsewhere. Nothing of this
            // is kept.
            return Ok(None);
        }
        tx.commit().await?;
        tracing::info!(reservation_id = %id, node_id = %plan.node_id, "queued reservation placed");
        Ok(Some(woken))
    }
}
