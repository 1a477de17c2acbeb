//! Reservations placed together: the requests that arrived while the last batch was written are
//! read once, planned one after another on what that read gave, and written in one transaction
//! of a dozen statements however many they are, with their requests' audit records. A request
//! the batch does not decide alone (the replay of an Idempotency-Key, no free fit, a cap or the
//! balance in the way) is left to the one-reservation path, which answers it as it always did.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use gpurent_billing::{PriceList, Quote};
use gpurent_sched::plan::{tier_priority, Ask, View};
use gpurent_sched::{Plan, Request};
use gpurent_types::api::Reservation;
use gpurent_types::Money;

use super::audit::{push_chain, run_chain, Head, HEAD, HEAD_COLUMNS};
use super::batch::Batch;
use super::batch_tenants::{earlier_keys, push_tenants};
use super::create::{
    push_inserts, quote_of, reservations_of, unless_replayed, Destination, NewRow,
};
use super::gpus::{self, Candidates, Lock};
use super::placement::push_bumps;
use super::{caps, ledger, new_id, retry_transient, ts, Backend, SqlStore};
use crate::{NewReservation, RecordWithin, Result, Want};

/// Batches written again after a plan went stale (another writer took its GPUs or money).
const BATCH_ATTEMPTS: usize = 3;

/// A reservation asked of the batch, with what its caller would have passed to `reserve`.
pub(super) struct Job {
    pub new: NewReservation,
    pub prices: PriceList,
    pub live_since: i64,
    pub now: DateTime<Utc>,
    pub expected: Vec<Request>,
    /// The request's audit record, written with its reservation.
    pub record: Option<RecordWithin>,
}

/// What the batch did with a job.
pub(super) enum Batched {
    /// Placed and committed: the reservation, the node to wake, and whether the job's audit
    /// record was committed with it.
    Placed {
        reservation: Box<Reservation>,
        nodes: Vec<String>,
        recorded: bool,
    },
    /// Not decided here: the one-reservation path takes it.
    Alone,
    /// The connection failed while the batch was written: its COMMIT may have been applied
    /// with only the answer lost. Answered unavailable (503), never placed again here: a
    /// retry with the request's Idempotency-Key finds what was committed.
    Unknown(String),
}

/// A batch written, or found stale (nothing kept: plan again from a fresh read).
enum Written {
    Done(Vec<Batched>),
    Stale,
}

/// A job the plans took.
struct Accepted {
    job: usize,
    id: String,
    plan: Plan,
    quote: Quote,
    type_name: String,
    node_name: String,
    /// Beyond its tenant's quota of a type with quotas.
    borrowed: bool,
}

/// Where a tenant stands against its quota of a type with quotas, as the batch places its
/// jobs: `None` for a tenant without one (whatever it takes there is borrowed).
type Standings = HashMap<(String, String), Option<super::quotas::Held>>;

/// The quota of each tenant and managed type among `jobs`, with what it holds, their rows
/// locked in one order (PostgreSQL), so that two batches locking some of the same never
/// deadlock.
async fn read_standings(
    tx: &mut sqlx::AnyConnection,
    backend: Backend,
    jobs: &[Job],
    managed: &std::collections::HashSet<&str>,
) -> Result<Standings> {
    let mut pairs: Vec<(String, String)> = jobs
        .iter()
        .filter(|j| managed.contains(j.new.gpu_type.key()))
        .map(|j| (j.new.tenant_id.clone(), j.new.gpu_type.key().to_owned()))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    let mut out = Standings::new();
    for (tenant, key) in pairs {
        let held = super::quotas::held_for(tx, backend, &tenant, &key).await?;
        out.insert((tenant, key), held);
    }
    Ok(out)
}

/// The candidates of one GPU type and request, read once for every job asking them.
type GroupKey = (String, bool, u64);

fn group_of(new: &NewReservation) -> GroupKey {
    match new.want {
        Want::Whole { count } => (new.gpu_type.key().to_owned(), true, u64::from(count)),
        Want::Share { vram_mb } => (new.gpu_type.key().to_owned(), false, vram_mb),
    }
}

impl SqlStore {
    /// Places `jobs` together; a job the batch leaves (or every job, when the batch fails on
    /// the database's verdict) is answered [`Batched::Alone`], every job of a batch that lost
    /// its connection [`Batched::Unknown`].
    pub(super) async fn reserve_batch(&self, jobs: &[Job]) -> Vec<Batched> {
        for _ in 0..BATCH_ATTEMPTS {
            match retry_transient("reserve_batch", || self.try_batch(jobs)).await {
                Ok(Written::Done(out)) => return out,
                Ok(Written::Stale) => continue,
                Err(e) if e.is_unavailable() => {
                    tracing::warn!(error = ?e, jobs = jobs.len(), "a batch of reservations lost its database connection; its outcome is for the clients' retries to find");
                    let why = "the database connection was lost while the reservation was \
                               written: retry with the same Idempotency-Key to learn whether it \
                               was made";
                    return jobs
                        .iter()
                        .map(|_| Batched::Unknown(why.to_owned()))
                        .collect();
                }
                Err(e) => {
                    tracing::debug!(error = %e, jobs = jobs.len(), "a batch of reservations failed; each goes alone");
                    break;
                }
            }
        }
        jobs.iter().map(|_| Batched::Alone).collect()
    }

    /// One batch in one transaction: on SQLite the store's connection, on PostgreSQL the
    /// writer's own (`held`).
    async fn try_batch(&self, jobs: &[Job]) -> Result<Written> {
        let (written, commit) = match self.backend {
            Backend::Sqlite => {
                let mut tx = self.begin().await?;
                let staged = self.stage(&mut tx, jobs).await?;
                if staged.1 {
                    tx.commit().await?;
                }
                staged
            }
            Backend::Postgres => {
                let mut tx = self.combiner.held.begin(self).await?;
                let staged = match self.stage(tx.conn()?, jobs).await {
                    Ok(staged) => staged,
                    Err(e) => {
                        // The connection stays for the next batch when it can still end
                        // the transaction (a lost race, a refused row); else it is closed.
                        let _ = tx.rollback().await;
                        return Err(e);
                    }
                };
                if staged.1 {
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
                staged
            }
        };
        if let (Written::Done(out), true) = (&written, commit) {
            let batch = out
                .iter()
                .filter(|b| matches!(b, Batched::Placed { .. }))
                .count();
            for b in out {
                if let Batched::Placed {
                    reservation, nodes, ..
                } = b
                {
                    tracing::info!(reservation_id = %reservation.id, node_id = %nodes.join(","), tenant_id = %reservation.tenant_id, tier = %reservation.tier, batch, "reserved");
                }
            }
        }
        Ok(written)
    }

    /// Reads, plans and writes `jobs` in the transaction open on `tx`; answers what was
    /// decided and whether it is to be committed.
    async fn stage(&self, tx: &mut sqlx::AnyConnection, jobs: &[Job]) -> Result<(Written, bool)> {
        let backend = self.backend;
        // One batch of reads: the tenants (with the count of earlier requests with the jobs'
        // keys) and the candidates of each group (room for all of the group's jobs).
        let mut reads = Batch::default();
        let mut types: Vec<&str> = jobs.iter().map(|j| j.new.gpu_type.key()).collect();
        types.sort_unstable();
        types.dedup();
        let tenant_part = push_tenants(&mut reads, jobs, &types);
        let mut groups: HashMap<GroupKey, (usize, i64)> = HashMap::new();
        for j in jobs {
            let g = groups.entry(group_of(&j.new)).or_insert((0, j.live_since));
            g.0 += 1;
            // The strictest view of which nodes are live.
            g.1 = g.1.max(j.live_since);
        }
        let lock = match backend {
            Backend::Postgres => Lock::SkipLocked,
            Backend::Sqlite => Lock::Wait,
        };
        let mut group_parts: HashMap<GroupKey, usize> = HashMap::new();
        for j in jobs {
            let key = group_of(&j.new);
            if group_parts.contains_key(&key) {
                continue;
            }
            let (count, live_since) = groups[&key];
            let part = gpus::push_candidates(
                &mut reads,
                backend,
                j.new.gpu_type.key(),
                j.new.want,
                live_since,
                lock,
                count.saturating_sub(1),
            );
            group_parts.insert(key, part);
        }
        // The audit trail's head: on SQLite with the reads (the transaction holds the write
        // lock already); on PostgreSQL its row lock is taken last, by the write statement just
        // before the records, so that other writers of the trail wait for this batch's commit
        // only.
        let recording = jobs.iter().any(|j| j.record.is_some());
        let head_part =
            (recording && backend == Backend::Sqlite).then(|| reads.push(HEAD, Vec::new()));
        let answers = reads.run(tx, backend).await?;
        let read_head = head_part.map(|p| Head::of(&answers, p)).transpose()?;
        // The types with quotas (read with the tenants; past 62 types, all are taken to have
        // some): each tenant's quota of them is read once, under its lock, and the batch counts
        // its jobs against it in order (`read_standings`).
        let bits: i64 = match answers.rows(tenant_part).first() {
            Some(row) => sqlx::Row::try_get(row, "managed")?,
            None => 0,
        };
        let managed: std::collections::HashSet<&str> = types
            .iter()
            .enumerate()
            .filter(|(i, _)| *i >= 62 || bits & (1_i64 << i) != 0)
            .map(|(_, t)| *t)
            .collect();
        let mut standings = if managed.is_empty() {
            Standings::new()
        } else {
            read_standings(tx, backend, jobs, &managed).await?
        };
        let mut tenants = self.tenants_of(tx, jobs, &answers, tenant_part).await?;
        let mut candidates: HashMap<&GroupKey, Candidates> = HashMap::new();
        for (key, &part) in &group_parts {
            candidates.insert(key, gpus::candidates_in(&answers, part, &key.0)?);
        }

        // The nodes that have each image asked for (the image-locality bonus).
        let mut having: HashMap<&str, std::collections::BTreeSet<String>> = HashMap::new();
        for image in jobs.iter().filter_map(|j| j.new.image.as_deref()) {
            if !having.contains_key(image) {
                having.insert(image, super::node_images::having(tx, image).await?);
            }
        }

        // Plan each job in order on what the earlier ones left.
        let mut free: HashMap<String, u64> = HashMap::new();
        // A key already used (or used twice in the batch) is a replay, answered alone.
        let mut keys = earlier_keys(tx, backend, jobs, &answers, tenant_part).await?;
        let mut accepted: Vec<Accepted> = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let new = &job.new;
            if let Some(key) = &new.idempotency_key {
                if !keys.insert((new.tenant_id.clone(), key.clone())) {
                    continue;
                }
            }
            // Against its tenant's quota, counting what the batch gave it already: past its
            // quota and borrow limit it is answered alone (the refusal says why); within it,
            // one that does not fit is placed alone too (it may take borrowed work back).
            let quota_key = (new.tenant_id.clone(), new.gpu_type.key().to_owned());
            let (borrowed, asked) = match standings.get(&quota_key) {
                None => (false, 0),
                Some(None) => (true, 0),
                Some(Some(held)) => {
                    let asked = gpurent_sched::quota::asked(new.want, held.card_vram_mb);
                    match gpurent_sched::quota::standing(true, Some(held.quota), held.used, asked) {
                        Err(_) => continue,
                        Ok(s) => (s == gpurent_sched::quota::Standing::Borrowed, asked),
                    }
                }
            };
            let Some(tenant) = tenants.get_mut(new.tenant_id.as_str()) else {
                continue;
            };
            let Some(found) = candidates.get(&group_of(new)) else {
                continue;
            };
            // Among equal fits, a node that has the image; the names follow the GPUs' order.
            let preferred = new.image.as_deref().and_then(|i| having.get(i));
            let order = match preferred {
                Some(p) if !p.is_empty() => gpurent_sched::preferred_order(&found.gpus, p),
                _ => (0..found.gpus.len()).collect(),
            };
            let mut view = View {
                gpus: order.iter().map(|&i| found.gpus[i].clone()).collect(),
                work: Vec::new(),
            };
            for g in &mut view.gpus {
                if let Some(&left) = free.get(&g.uuid) {
                    g.free_mb = left;
                }
            }
            let ask = Ask {
                request: new.want,
                priority: tier_priority(new.tier, None, false),
            };
            let Ok(plan) = gpurent_sched::plan(&view, &ask, &job.expected) else {
                continue;
            };
            let Some(first) = view
                .gpus
                .iter()
                .position(|g| Some(&g.uuid) == plan.gpus.first().map(|(u, _)| u))
            else {
                continue;
            };
            let Ok(quote) = quote_of(&job.prices, new, view.gpus[first].vram_mb) else {
                continue;
            };
            let price = quote.price_per_hour.micros();
            if let Some((max_live, max_spend)) = tenant.caps {
                let spend = Money::from_micros(tenant.spend);
                if caps::refusal(
                    max_live,
                    max_spend,
                    tenant.live,
                    spend,
                    quote.price_per_hour,
                    caps::Whose::Tenant,
                )
                .is_some()
                {
                    continue;
                }
            }
            let hold = quote.hold.micros();
            let covered = if hold > 0 {
                tenant.balance >= hold
            } else {
                tenant.balance > 0
            };
            if !covered {
                continue;
            }
            for (uuid, mb) in &plan.gpus {
                if let Some(g) = view.gpus.iter().find(|g| &g.uuid == uuid) {
                    free.insert(uuid.clone(), g.free_mb.saturating_sub(*mb));
                }
            }
            tenant.balance -= hold.max(0);
            tenant.live += 1;
            tenant.spend = tenant.spend.saturating_add(price);
            if let Some(Some(held)) = standings.get_mut(&quota_key) {
                held.used = held.used.saturating_add(asked);
            }
            accepted.push(Accepted {
                job: i,
                id: new_id(),
                type_name: found.type_names[order[first]].clone(),
                node_name: found.node_names[order[first]].clone(),
                plan,
                quote,
                borrowed,
            });
        }
        let mut out: Vec<Batched> = jobs.iter().map(|_| Batched::Alone).collect();
        if accepted.is_empty() {
            return Ok((Written::Done(out), false));
        }

        // One batch of writes: the rows and meters, the claims, the nodes' versions, the holds.
        let gpu_uuids: Vec<Vec<&str>> = accepted
            .iter()
            .map(|a| a.plan.gpus.iter().map(|(u, _)| u.as_str()).collect())
            .collect();
        let rows: Vec<NewRow<'_>> = accepted
            .iter()
            .zip(&gpu_uuids)
            .map(|(a, uuids)| {
                let job = &jobs[a.job];
                NewRow {
                    id: &a.id,
                    new: &job.new,
                    type_name: &a.type_name,
                    quote: &a.quote,
                    host_share_bps: job.prices.host_share_bps,
                    at: ts(job.now),
                    destination: Destination::Placed {
                        node_id: &a.plan.node_id,
                        node_name: &a.node_name,
                        gpus: uuids,
                    },
                    borrowed: a.borrowed,
                }
            })
            .collect();
        let mut batch = Batch::default();
        let one = backend == Backend::Postgres;
        let row_part = push_inserts(&mut batch, &rows, one);
        let takes: Vec<(&str, &Plan)> = accepted.iter().map(|a| (a.id.as_str(), &a.plan)).collect();
        let claims = gpus::push_claims(&mut batch, &takes);
        if !managed.is_empty() {
            // What the quotas' tenants now hold (`quotas.used`).
            let uses: Vec<(&str, &Plan)> = accepted
                .iter()
                .filter(|a| managed.contains(jobs[a.job].new.gpu_type.key()))
                .map(|a| (jobs[a.job].new.tenant_id.as_str(), &a.plan))
                .collect();
            super::quota_use::push_use(&mut batch, &uses);
        }
        let nodes: Vec<String> = accepted.iter().map(|a| a.plan.node_id.clone()).collect();
        push_bumps(&mut batch, backend, nodes);
        let holds: Vec<ledger::Hold<'_>> = accepted
            .iter()
            .map(|a| ledger::Hold {
                tenant_id: &jobs[a.job].new.tenant_id,
                reservation_id: &a.id,
                amount: a.quote.hold.micros(),
                at: ts(jobs[a.job].now),
            })
            .collect();
        if one {
            // Locked in order before the statement that moves the money, whose parts run in
            // no set order (two writers may hold batches of the same tenants).
            let mut locks = Batch::default();
            ledger::push_account_locks(
                &mut locks,
                holds.iter().filter(|h| h.amount > 0).map(|h| h.tenant_id),
            );
            locks.run(tx, backend).await?;
        }
        let holds = ledger::push_holds(&mut batch, &holds);
        // On PostgreSQL the trail's head is locked and read by the write statement itself,
        // one round trip fewer than a statement of its own just after it.
        let records = accepted.iter().any(|a| jobs[a.job].record.is_some());
        let head_part =
            (one && records && read_head.is_none()).then(|| batch.push(HEAD, Vec::new()));
        let written = if one {
            batch
                .run_as_one(tx, row_part, head_part.map(|p| (p, HEAD_COLUMNS)))
                .await
        } else {
            batch.run(tx, backend).await
        };
        let Some(answers) = unless_replayed(written)? else {
            // A key committed by another writer meanwhile: each finds its replay alone.
            return Ok((Written::Done(out), false));
        };
        if !claims.held(&answers) || !holds.covered(&answers)? {
            return Ok((Written::Stale, false));
        }
        let reservations = reservations_of(&answers, row_part, &rows)?;
        let head = match (read_head, head_part) {
            (Some(head), _) => Some(head),
            (None, Some(part)) => Some(Head::beside(&answers, row_part, part)?),
            (None, None) => None,
        };
        if let Some(head) = head {
            self.record_placed(tx, jobs, &accepted, &reservations, head)
                .await?;
        }
        for (a, r) in accepted.iter().zip(reservations) {
            out[a.job] = Batched::Placed {
                reservation: Box::new(r),
                nodes: vec![a.plan.node_id.clone()],
                recorded: jobs[a.job].record.is_some(),
            };
        }
        Ok((Written::Done(out), true))
    }

    /// Chains the audit records of the placed jobs that carry one after `head`, in the
    /// batch's transaction: outcome 201 (what the handler answers a placement) and the
    /// reservation's allocation, as the request's middleware would have written them.
    async fn record_placed(
        &self,
        conn: &mut sqlx::AnyConnection,
        jobs: &[Job],
        accepted: &[Accepted],
        reservations: &[Reservation],
        head: Head,
    ) -> Result<()> {
        let mut entries = Vec::new();
        let mut trail = None;
        for (a, r) in accepted.iter().zip(reservations) {
            let Some(record) = &jobs[a.job].record else {
                continue;
            };
            let mut entry = record.entry.clone();
            entry.outcome = 201;
            entry.allocation = Some(crate::allocation_of(r));
            entries.push(entry);
            // Every job of a replica carries the same signer and policy.
            trail.get_or_insert(record);
        }
        let Some(trail) = trail else {
            return Ok(());
        };
        let now = jobs.iter().map(|j| j.now).max().unwrap_or_default();
        let mut batch = Batch::default();
        let (_, part) = push_chain(&mut batch, head, entries, &trail.signer, trail.policy, now);
        run_chain(conn, self.backend, batch, part).await
    }
}
