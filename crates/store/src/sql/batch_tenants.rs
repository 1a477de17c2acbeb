//! What a reservation batch reads of its tenants: their caps and balances in one statement,
//! with the count of earlier requests that used one of the jobs' Idempotency-Keys beside them,
//! and (for a capped tenant) what it has live.

use std::collections::{BTreeMap, HashSet};

use gpurent_types::Money;
use sqlx::Row;

use super::batch::{placeholders, Answers, Arg, Batch};
use super::batched::Job;
use super::{caps, ledger, Backend, SqlStore};
use crate::Result;

/// The reads of one tenant: its caps and balance, and (when capped) what it has live.
pub(super) struct Tenant {
    pub caps: Option<(i64, Money)>,
    pub balance: i64,
    /// Live reservations and their spend per hour, counting the batch's own.
    pub live: i64,
    pub spend: i64,
}

/// The distinct tenants of `jobs` with a key, and the distinct keys.
fn keyed(jobs: &[Job]) -> (Vec<&str>, Vec<&str>) {
    let mut tenants: Vec<&str> = Vec::new();
    let mut keys: Vec<&str> = Vec::new();
    for j in jobs {
        let Some(key) = &j.new.idempotency_key else {
            continue;
        };
        if !tenants.contains(&j.new.tenant_id.as_str()) {
            tenants.push(&j.new.tenant_id);
        }
        if !keys.contains(&key.as_str()) {
            keys.push(key);
        }
    }
    (tenants, keys)
}

/// The condition on `reservations` that finds earlier requests with the keys of `keyed`, its
/// placeholders numbered from `from`. Both columns of the unique index on (tenant_id,
/// idempotency_key) are given as lists, so that the index is probed for each pair: a
/// condition on the tenant alone would walk all of a busy tenant's reservations. A pair that
/// no job asked (one tenant's key with another tenant) is not a replay for anyone, and the
/// caller looks up only the pairs its jobs carry.
fn earlier_condition(tenants: &[&str], keys: &[&str], from: usize) -> String {
    format!(
        "tenant_id IN ({}) AND idempotency_key IN ({})",
        placeholders(from, tenants.len()),
        placeholders(from + tenants.len(), keys.len())
    )
}

/// Adds to `reads` the one read of the batch's tenants: a row each, with its caps
/// (`caps::caps_of` reads them), its balance and, in `earlier`, how many reservations earlier
/// requests made with the jobs' Idempotency-Keys (the same count on every row; one statement
/// for the batch, where each tenant and the keys' read were a round trip each on PostgreSQL).
/// Also, in `managed`, which of `types` (at most 62) have quotas: bit `i` for `types[i]`.
pub(super) fn push_tenants(reads: &mut Batch, jobs: &[Job], types: &[&str]) -> usize {
    let mut tenants: Vec<&str> = jobs.iter().map(|j| j.new.tenant_id.as_str()).collect();
    tenants.sort_unstable();
    tenants.dedup();
    let mut args = Vec::new();
    let mut pairs = Vec::new();
    for t in &tenants {
        pairs.push(format!("(${}, ${})", args.len() + 1, args.len() + 2));
        args.extend([Arg::from(*t), Arg::from(ledger::user_account(t))]);
    }
    let (keyed_tenants, keys) = keyed(jobs);
    let earlier = if keys.is_empty() {
        "0".to_owned()
    } else {
        let condition = earlier_condition(&keyed_tenants, &keys, args.len() + 1);
        args.extend(keyed_tenants.iter().chain(&keys).map(|s| Arg::from(*s)));
        format!("(SELECT COUNT(*) FROM reservations WHERE {condition})")
    };
    let mut managed = vec!["0".to_owned()];
    for (i, t) in types.iter().take(62).enumerate() {
        managed.push(format!(
            "(CASE WHEN EXISTS (SELECT 1 FROM quotas WHERE type_key = ${}) THEN {} ELSE 0 END)",
            args.len() + 1,
            1_i64 << i
        ));
        args.push(Arg::from(*t));
    }
    let managed = managed.join(" + ");
    // VALUES names its columns column1, column2 on both databases.
    let sql = format!(
        "SELECT u.id AS user_id, u.max_reservations, u.max_spend_per_hour, u.over_budget,
             a.balance, {earlier} AS earlier, CAST({managed} AS BIGINT) AS managed
         FROM (VALUES {}) t JOIN users u ON u.id = t.column1
         LEFT JOIN accounts a ON a.id = t.column2
         ORDER BY u.id",
        pairs.join(", ")
    );
    reads.push(sql, args)
}

/// The (tenant, key) pairs of earlier requests with the jobs' keys, as [`push_tenants`]
/// counted them; read only when it counted some (a replay: rare).
pub(super) async fn earlier_keys(
    conn: &mut sqlx::AnyConnection,
    backend: Backend,
    jobs: &[Job],
    answers: &Answers,
    part: usize,
) -> Result<HashSet<(String, String)>> {
    let counted: i64 = match answers.rows(part).first() {
        Some(row) => row.try_get("earlier")?,
        None => 0,
    };
    if counted == 0 {
        return Ok(HashSet::new());
    }
    let (tenants, keys) = keyed(jobs);
    let mut read = Batch::default();
    let part = read.push(
        format!(
            "SELECT tenant_id, idempotency_key FROM reservations WHERE {}",
            earlier_condition(&tenants, &keys, 1)
        ),
        tenants.into_iter().chain(keys).map(Arg::from).collect(),
    );
    let answers = read.run(conn, backend).await?;
    answers
        .rows(part)
        .iter()
        .map(|r| Ok((r.try_get("tenant_id")?, r.try_get("idempotency_key")?)))
        .collect()
}

impl SqlStore {
    /// The tenants of `jobs` as [`push_tenants`] read them into part `part` of `answers`; a
    /// capped tenant's live reservations are counted, under a lock of its user row on
    /// PostgreSQL (as `caps::check` takes it), taken in the rows' order: by id.
    pub(super) async fn tenants_of<'j>(
        &self,
        conn: &mut sqlx::AnyConnection,
        jobs: &'j [Job],
        answers: &Answers,
        part: usize,
    ) -> Result<BTreeMap<&'j str, Tenant>> {
        let mut tenants = BTreeMap::new();
        let mut usage = Batch::default();
        let mut counted = Vec::new();
        for row in answers.rows(part) {
            let id: String = row.try_get("user_id")?;
            let Some(job) = jobs.iter().find(|j| j.new.tenant_id == id) else {
                continue;
            };
            let t = job.new.tenant_id.as_str();
            let caps = caps::caps_of(row, &job.new.limits)?;
            let balance: Option<i64> = row.try_get("balance")?;
            let Some(balance) = balance else { continue };
            // Marked over a budget (this month's or an earlier one the budget pass has not yet
            // cleared): the one-reservation path answers it.
            if row.try_get::<Option<String>, _>("over_budget")?.is_some() {
                continue;
            }
            if caps.is_some() {
                let usage = caps::push_usage(&mut usage, self.backend, t, "");
                counted.push((t, caps, job.new.limits, usage));
            }
            tenants.insert(
                t,
                Tenant {
                    caps,
                    balance,
                    live: 0,
                    spend: 0,
                },
            );
        }
        if counted.is_empty() {
            return Ok(tenants);
        }
        let answers = usage.run(conn, self.backend).await?;
        for (t, caps, limits, part) in counted {
            let (caps_now, live, spend) = caps::usage_in(&answers, &part, caps, t, &limits)?;
            if let Some(tenant) = tenants.get_mut(t) {
                tenant.caps = caps_now;
                tenant.live = live;
                tenant.spend = spend.micros();
            }
        }
        Ok(tenants)
    }
}
