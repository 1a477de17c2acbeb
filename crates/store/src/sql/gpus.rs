//! GPUs as placement reads and takes them: the candidates for a request, the work that could
//! be preempted, the queue's view of a type, and claiming a plan's memory by compare-and-set.

use gpurent_sched::plan::{tier_priority, Gpu, Work};
use gpurent_sched::Plan;
use gpurent_types::{ReservationStatus, Tier};
use sqlx::{AnyConnection, Row};

use super::batch::{Answers, Arg, Batch};
use super::switch_of;
use crate::{Backend, Result, StoreError, Want};

/// A node that may get new work, its alias `n`: heard from at or after the parameter given,
/// verified, healthy and ready.
macro_rules! placeable {
    ($since:literal) => {
        concat!(
            "n.last_seen_at >= ",
            $since,
            " AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'"
        )
    };
}
pub(crate) use placeable;

/// The best-fitting GPUs read as candidates for a share.
const SHARE_CANDIDATES: i64 = 16;
/// The best-fitting nodes (fewest whole free GPUs that still hold the request) read as
/// candidates for whole GPUs, with all their GPUs of the type.
const WHOLE_CANDIDATE_NODES: i64 = 3;

/// Candidate GPUs with the GPU model's name as their node reported it, and their node's name.
pub(super) struct Candidates {
    pub gpus: Vec<Gpu>,
    pub type_names: Vec<String>,
    pub node_names: Vec<String>,
}

impl Candidates {
    /// Keeps the GPUs of the nodes `keep` says yes to (by the node's name), their names with
    /// them.
    pub fn retain_nodes(&mut self, keep: impl Fn(&str) -> bool) {
        let kept: Vec<bool> = self.node_names.iter().map(|n| keep(n)).collect();
        let mut i = 0;
        self.gpus.retain(|_| {
            i += 1;
            kept[i - 1]
        });
        for names in [&mut self.type_names, &mut self.node_names] {
            let mut i = 0;
            names.retain(|_| {
                i += 1;
                kept[i - 1]
            });
        }
    }

    /// The GPUs in `gpurent_sched::preferred_order` (the preferred nodes' first; the placers
    /// look at the order only to break ties), their names with them.
    pub fn prefer_nodes(&mut self, preferred: &std::collections::BTreeSet<String>) {
        if preferred.is_empty() {
            return;
        }
        let order = gpurent_sched::preferred_order(&self.gpus, preferred);
        let take = |v: &mut Vec<String>| {
            let mut old: Vec<Option<String>> = std::mem::take(v).into_iter().map(Some).collect();
            *v = order
                .iter()
                .filter_map(|&i| old.get_mut(i)?.take())
                .collect();
        };
        take(&mut self.type_names);
        take(&mut self.node_names);
        let mut old: Vec<Option<Gpu>> = std::mem::take(&mut self.gpus)
            .into_iter()
            .map(Some)
            .collect();
        self.gpus = order
            .iter()
            .filter_map(|&i| old.get_mut(i)?.take())
            .collect();
    }
}

/// How the candidate read locks on PostgreSQL (SQLite has one writer and locks nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lock {
    /// Rows another placement holds are passed over: placements of one type spread over
    /// nodes instead of queueing behind each other.
    SkipLocked,
    /// Waits for them: what is left when every candidate was another's.
    Wait,
}

fn mb(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn gpu_of(row: &sqlx::any::AnyRow) -> Result<Gpu> {
    Ok(Gpu {
        node_id: row.try_get("node_id")?,
        uuid: row.try_get("uuid")?,
        vram_mb: mb(row.try_get("vram_mb")?),
        free_mb: mb(row.try_get("free_mb")?),
        switch: switch_of(row)?,
    })
}

/// The candidate GPUs of type `key` for `want` on nodes placeable since `live_since`, in the
/// order ties go (tightest first). On PostgreSQL the rows read are locked (the nodes' pools
/// for whole GPUs, the GPUs for a share) for the rest of the transaction.
pub(super) async fn candidates(
    conn: &mut AnyConnection,
    backend: Backend,
    key: &str,
    want: Want,
    live_since: i64,
    lock: Lock,
) -> Result<Candidates> {
    let mut batch = Batch::default();
    let part = push_candidates(&mut batch, backend, key, want, live_since, lock, 0);
    let answers = batch.run(conn, backend).await?;
    candidates_in(&answers, part, key)
}

/// Adds to `batch` the read of [`candidates`], with room for `more` placements besides the
/// first (a batch of reservations plans several on what it reads once); returns its index.
pub(super) fn push_candidates(
    batch: &mut Batch,
    backend: Backend,
    key: &str,
    want: Want,
    live_since: i64,
    lock: Lock,
    more: usize,
) -> usize {
    let more = i64::try_from(more).unwrap_or(i64::MAX);
    match want {
        Want::Whole { count } => {
            // The best-fitting live nodes, answered by the index, and their GPUs (the used
            // ones too: they count in the nodes' fragmentation). GPUs of other types are
            // dropped by `candidates_in`: with the type in the join, SQLite read every GPU of
            // the type through the type's index for each node (20 ms a placement instead of
            // 0.5).
            let sql = match (backend, lock) {
                (Backend::Sqlite, _) => WHOLE_SQL,
                (Backend::Postgres, Lock::SkipLocked) => WHOLE_SQL_SKIP_LOCKED,
                (Backend::Postgres, Lock::Wait) => WHOLE_SQL_WAIT,
            };
            batch.push(
                sql,
                vec![
                    Arg::from(key),
                    Arg::from(i64::from(count)),
                    Arg::from(live_since),
                    Arg::from(WHOLE_CANDIDATE_NODES.saturating_add(more)),
                ],
            )
        }
        Want::Share { vram_mb } => {
            let sql = match (backend, lock) {
                (Backend::Sqlite, _) => SHARE_SQL,
                (Backend::Postgres, Lock::SkipLocked) => SHARE_SQL_SKIP_LOCKED,
                (Backend::Postgres, Lock::Wait) => SHARE_SQL_WAIT,
            };
            batch.push(
                sql,
                vec![
                    Arg::from(key),
                    Arg::from(mb_arg(vram_mb)),
                    Arg::from(live_since),
                    Arg::from(SHARE_CANDIDATES.saturating_add(more)),
                ],
            )
        }
    }
}

/// The candidates of type `key` that [`push_candidates`] read at `part`.
pub(super) fn candidates_in(answers: &Answers, part: usize, key: &str) -> Result<Candidates> {
    let rows = answers.rows(part);
    let mut found = Candidates {
        gpus: Vec::with_capacity(rows.len()),
        type_names: Vec::with_capacity(rows.len()),
        node_names: Vec::with_capacity(rows.len()),
    };
    for row in rows {
        if row.try_get::<String, _>("type_key")? != key {
            continue;
        }
        found.gpus.push(gpu_of(row)?);
        found.type_names.push(row.try_get("type_name")?);
        found.node_names.push(row.try_get("node_name")?);
    }
    Ok(found)
}

macro_rules! whole_sql {
    ($lock:literal) => {
        concat!(
            "SELECT g.uuid, g.node_id, g.type_name, g.type_key, g.vram_mb, g.free_mb, g.switch_group,
                    b.node_name
             FROM (SELECT p.node_id, p.whole_free, n.name AS node_name
                   FROM gpu_pools p JOIN nodes n ON n.id = p.node_id
                   WHERE p.type_key = $1 AND p.whole_free >= $2 AND ",
            placeable!("$3"),
            " ORDER BY p.whole_free, p.node_id LIMIT $4",
            $lock,
            ") b JOIN gpus g ON g.node_id = b.node_id
             ORDER BY b.whole_free, b.node_id, g.idx"
        )
    };
}
const WHOLE_SQL: &str = whole_sql!("");
const WHOLE_SQL_SKIP_LOCKED: &str = whole_sql!(" FOR UPDATE OF p SKIP LOCKED");
const WHOLE_SQL_WAIT: &str = whole_sql!(" FOR UPDATE OF p");

// The tightest fits first: shared GPUs have less free than whole ones.
macro_rules! share_sql {
    ($lock:literal) => {
        concat!(
            "SELECT g.uuid, g.node_id, g.type_name, g.type_key, g.vram_mb, g.free_mb, g.switch_group,
                    n.name AS node_name
             FROM gpus g JOIN nodes n ON n.id = g.node_id
             WHERE g.type_key = $1 AND g.free_mb >= $2 AND ",
            placeable!("$3"),
            " ORDER BY g.free_mb, g.uuid LIMIT $4",
            $lock
        )
    };
}
const SHARE_SQL: &str = share_sql!("");
const SHARE_SQL_SKIP_LOCKED: &str = share_sql!(" FOR UPDATE OF g SKIP LOCKED");
const SHARE_SQL_WAIT: &str = share_sql!(" FOR UPDATE OF g");

/// The work of type `key` a request of `priority` may preempt, with the GPUs of the nodes it
/// is on: spot work of lower priority and, for a request within its tenant's quota
/// (`guaranteed_for`: that tenant), other tenants' borrowed work but reserved blocks, seen at
/// [`gpurent_sched::quota::BORROWED`] priority and no value, so that it goes first.
pub(super) async fn preemptible(
    conn: &mut AnyConnection,
    key: &str,
    priority: i64,
    live_since: i64,
    guaranteed_for: Option<&str>,
) -> Result<gpurent_sched::plan::View> {
    // '' matches no tenant's borrowed work: a request that is not guaranteed.
    let guaranteed = guaranteed_for.unwrap_or("");
    // Who may be preempted, with the guaranteed tenant's placeholder `g`.
    let victim = |g: &str| {
        format!(
            "((r.tier = 'spot' AND r.priority < $1)
              OR (r.borrowed = 1 AND r.tier <> 'reserved' AND {g} <> '' AND r.tenant_id <> {g}))"
        )
    };
    let rows = sqlx::query(&format!(
        "SELECT r.id, r.tier, r.priority, r.status, r.price_per_hour, r.duration_s, r.started_at,
                COALESCE(r.started_at, r.created_at) AS since, a.gpu_uuid, a.vram_mb,
                CASE WHEN r.borrowed = 1 AND r.tier <> 'reserved' AND $4 <> ''
                     AND r.tenant_id <> $4 THEN 1 ELSE 0 END AS reclaim
         FROM reservations r JOIN allocations a ON a.reservation_id = r.id
              JOIN gpus g ON g.uuid = a.gpu_uuid JOIN nodes n ON n.id = g.node_id
         WHERE {} AND r.status IN ('pending', 'starting', 'running')
           AND g.type_key = $2 AND {}
         ORDER BY r.id, a.gpu_uuid",
        victim("$4"),
        placeable!("$3")
    ))
    .bind(priority)
    .bind(key)
    .bind(live_since)
    .bind(guaranteed)
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Ok(gpurent_sched::plan::View::default());
    }
    let mut work = work_of(&rows, 0)?;
    // Borrowed work a guaranteed request takes back: first, whatever it pays.
    let reclaim: std::collections::HashSet<String> = rows
        .iter()
        .filter(|r| r.try_get::<i64, _>("reclaim").is_ok_and(|x| x == 1))
        .filter_map(|r| r.try_get::<String, _>("id").ok())
        .collect();
    for w in &mut work {
        if reclaim.contains(&w.id) {
            w.priority = gpurent_sched::quota::BORROWED;
            w.value = 0;
        }
    }
    let gpus = sqlx::query(&format!(
        "SELECT uuid, node_id, vram_mb, free_mb, switch_group FROM gpus
         WHERE type_key = $2 AND node_id IN (
            SELECT r.node_id FROM reservations r
            WHERE {} AND r.status IN ('pending', 'starting', 'running'))
         ORDER BY node_id, idx",
        victim("$3")
    ))
    .bind(priority)
    .bind(key)
    .bind(guaranteed)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(gpu_of)
    .collect::<Result<Vec<_>>>()?;
    Ok(gpurent_sched::plan::View { gpus, work })
}

/// The type key of the GPU `uuid` ('' when there is none).
pub(super) async fn type_of(conn: &mut AnyConnection, uuid: &str) -> Result<String> {
    Ok(
        sqlx::query_scalar::<_, String>("SELECT type_key FROM gpus WHERE uuid = $1")
            .bind(uuid)
            .fetch_optional(&mut *conn)
            .await?
            .unwrap_or_default(),
    )
}

/// The GPUs of type `key` on placeable nodes, by node.
pub(super) async fn live_of_type(
    conn: &mut AnyConnection,
    key: &str,
    live_since: i64,
) -> Result<Vec<Gpu>> {
    sqlx::query(concat!(
        "SELECT g.uuid, g.node_id, g.vram_mb, g.free_mb, g.switch_group FROM gpus g
         JOIN nodes n ON n.id = g.node_id WHERE g.type_key = $1 AND ",
        placeable!("$2"),
        " ORDER BY g.node_id, g.idx"
    ))
    .bind(key)
    .bind(live_since)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(gpu_of)
    .collect()
}

/// The work holding memory on GPUs of type `key` on placeable nodes, as of `now`.
pub(super) async fn held_on_type(
    conn: &mut AnyConnection,
    key: &str,
    live_since: i64,
    now: i64,
) -> Result<Vec<Work>> {
    let rows = sqlx::query(concat!(
        "SELECT r.id, r.tier, r.priority, r.status, r.price_per_hour, r.duration_s,
                r.started_at, COALESCE(r.started_at, r.placed_at, r.created_at) AS since,
                a.gpu_uuid, a.vram_mb
         FROM reservations r JOIN allocations a ON a.reservation_id = r.id
              JOIN gpus g ON g.uuid = a.gpu_uuid JOIN nodes n ON n.id = g.node_id
         WHERE g.type_key = $1 AND ",
        placeable!("$2"),
        " AND r.status IN ('pending', 'starting', 'running', 'stopping')
         ORDER BY r.id, a.gpu_uuid"
    ))
    .bind(key)
    .bind(live_since)
    .fetch_all(&mut *conn)
    .await?;
    work_of(&rows, now)
}

/// Work from rows of reservations joined with their allocations, ordered by reservation:
/// priorities as the planner ranks them, times in microseconds. Work placed but not started is due
/// to end its hours after `now`; work stopping ends at `now`.
fn work_of(rows: &[sqlx::any::AnyRow], now: i64) -> Result<Vec<Work>> {
    let mut work: Vec<Work> = Vec::new();
    for r in rows {
        let id: String = r.try_get("id")?;
        let hold = (r.try_get("gpu_uuid")?, mb(r.try_get("vram_mb")?));
        if let Some(last) = work.last_mut().filter(|w| w.id == id) {
            last.holds.push(hold);
            continue;
        }
        let tier: String = r.try_get("tier")?;
        let tier = tier
            .parse::<Tier>()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let status: String = r.try_get("status")?;
        let stopping = status == ReservationStatus::Stopping.as_str();
        let started_at: Option<i64> = r.try_get("started_at")?;
        let duration_us = r.try_get::<i64, _>("duration_s")?.saturating_mul(1_000_000);
        let ends_at = match (stopping, started_at) {
            (true, _) => now,
            (false, Some(s)) => s.saturating_add(duration_us),
            (false, None) => now.saturating_add(duration_us),
        };
        work.push(Work {
            id,
            priority: tier_priority(tier, r.try_get("priority")?, stopping),
            value: r.try_get("price_per_hour")?,
            started_at: r.try_get("since")?,
            ends_at,
            holds: vec![hold],
        });
    }
    Ok(work)
}

/// The compare-and-sets of plans in a batch ([`push_claims`]).
pub(super) struct Claims {
    part: usize,
    gpus: usize,
}

impl Claims {
    /// Whether every GPU still had the memory: false when a plan was made from a stale view
    /// (and the caller rolls the transaction back; what the batch did after is undone with it).
    pub fn held(&self, answers: &Answers) -> bool {
        answers.affected(self.part) == u64::try_from(self.gpus).unwrap_or(u64::MAX)
    }
}

/// What a batch of plans takes of one GPU.
struct Take<'a> {
    node_id: &'a str,
    mb: u64,
    whole: bool,
}

/// Adds to `batch` the taking of each plan's memory for its reservation (written before in
/// the transaction), `takes` being (reservation id, plan): each GPU only while it still has
/// the memory all the plans on it take (whole GPUs: all of it), the nodes' counts of whole free
/// GPUs, and the allocations kept with them. Three statements, however many plans.
pub(super) fn push_claims(batch: &mut Batch, takes: &[(&str, &Plan)]) -> Claims {
    let mut on_gpu: std::collections::BTreeMap<&str, Take<'_>> = Default::default();
    for (_, plan) in takes {
        for (uuid, want) in &plan.gpus {
            let take = on_gpu.entry(uuid.as_str()).or_insert(Take {
                node_id: &plan.node_id,
                mb: 0,
                whole: false,
            });
            take.mb = take.mb.saturating_add(*want);
            take.whole |= plan.whole;
        }
    }
    if on_gpu.is_empty() {
        return Claims { part: 0, gpus: 0 };
    }
    // The claims, one row of VALUES per GPU: (uuid, node, MiB, whole only).
    let mut values = Vec::with_capacity(on_gpu.len());
    let mut args = Vec::with_capacity(on_gpu.len() * 4);
    for (uuid, take) in &on_gpu {
        let n = args.len();
        values.push(format!(
            "(${}, ${}, CAST(${} AS BIGINT), CAST(${} AS BIGINT))",
            n + 1,
            n + 2,
            n + 3,
            n + 4
        ));
        args.push(Arg::from(*uuid));
        args.push(Arg::from(take.node_id));
        args.push(Arg::from(mb_arg(take.mb)));
        args.push(Arg::from(i64::from(take.whole)));
    }
    let values = values.join(", ");
    // A GPU whole and free until now leaves its node's pool of whole free GPUs: counted
    // before the claims below change it (and in the same snapshot, should the statements run
    // as one), once per pool. Guarded so that the count never goes below zero when a claim
    // fails (that transaction rolls back anyway).
    batch.push(
        format!(
            "UPDATE gpu_pools SET whole_free = whole_free - c.n
             FROM (SELECT g.node_id, g.type_key, COUNT(*) AS n
                   FROM gpus g JOIN (VALUES {values}) AS v ON g.uuid = v.column1
                   WHERE g.free_mb = g.vram_mb GROUP BY g.node_id, g.type_key) AS c
             WHERE gpu_pools.node_id = c.node_id AND gpu_pools.type_key = c.type_key
               AND gpu_pools.whole_free >= c.n"
        ),
        args.clone(),
    );
    let part = batch.push(
        format!(
            "UPDATE gpus SET free_mb = free_mb - v.column3 FROM (VALUES {values}) AS v
             WHERE gpus.uuid = v.column1 AND gpus.node_id = v.column2
               AND gpus.free_mb >= v.column3
               AND (v.column4 = 0 OR gpus.free_mb = gpus.vram_mb)
             RETURNING gpus.uuid"
        ),
        args,
    );
    // One statement for all the allocations, which fails on nothing: when a claim above
    // failed (a GPU gone, or the reservation already holding it) the caller rolls back.
    let mut rows = Vec::new();
    let mut args = Vec::new();
    for (reservation_id, plan) in takes {
        for (uuid, want) in &plan.gpus {
            let n = args.len();
            rows.push(format!(
                "(${}, ${}, CAST(${} AS BIGINT))",
                n + 1,
                n + 2,
                n + 3
            ));
            args.push(Arg::from(*reservation_id));
            args.push(Arg::from(uuid));
            args.push(Arg::from(mb_arg(*want)));
        }
    }
    batch.push(
        format!(
            "INSERT INTO allocations (reservation_id, gpu_uuid, vram_mb) VALUES {}
             ON CONFLICT DO NOTHING",
            rows.join(", ")
        ),
        args,
    );
    Claims {
        part,
        gpus: on_gpu.len(),
    }
}

fn mb_arg(mb: u64) -> i64 {
    i64::try_from(mb).unwrap_or(i64::MAX)
}

/// The memory of the largest GPU of type `key`, the type's name and the most GPUs of it on one
/// node; `None` when no node has one.
pub(super) async fn largest(
    conn: &mut AnyConnection,
    key: &str,
) -> Result<Option<(u64, String, i64)>> {
    let row = sqlx::query(
        "SELECT MAX(vram_mb) AS vram_mb, MIN(type_name) AS type_name,
                CAST(COALESCE(MAX(n), 0) AS BIGINT) AS most_on_one_node
         FROM gpus g JOIN (SELECT node_id, COUNT(*) AS n FROM gpus WHERE type_key = $1
                           GROUP BY node_id) c ON c.node_id = g.node_id
         WHERE g.type_key = $1",
    )
    .bind(key)
    .fetch_one(&mut *conn)
    .await?;
    let vram: Option<i64> = row.try_get("vram_mb")?;
    let Some(vram) = vram else { return Ok(None) };
    Ok(Some((
        mb(vram),
        row.try_get("type_name")?,
        row.try_get("most_on_one_node")?,
    )))
}

/// The most whole free GPUs of type `key` on one placeable node.
pub(super) async fn most_whole_free(
    conn: &mut AnyConnection,
    key: &str,
    live_since: i64,
) -> Result<u32> {
    let most: Option<i64> = sqlx::query_scalar(concat!(
        "SELECT MAX(p.whole_free) FROM gpu_pools p JOIN nodes n ON n.id = p.node_id
         WHERE p.type_key = $1 AND ",
        placeable!("$2")
    ))
    .bind(key)
    .bind(live_since)
    .fetch_one(&mut *conn)
    .await?;
    Ok(u32::try_from(most.unwrap_or(0)).unwrap_or(0))
}

/// A node's name.
pub(super) async fn node_name(conn: &mut AnyConnection, node_id: &str) -> Result<String> {
    sqlx::query_scalar("SELECT name FROM nodes WHERE id = $1")
        .bind(node_id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::not_found("node", node_id))
}
