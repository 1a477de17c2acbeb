//! Mounting volumes into a reservation: under the volumes' row locks, one live writer or any
//! number of live readers, and none of a volume being deleted; the GPUs its volumes allow.

use std::collections::BTreeMap;

use sqlx::{AnyConnection, Row};

use super::batch::{Arg, Batch};
use super::fragments::live_statuses;
use super::gpus::{candidates_in, placeable, Candidates};
use crate::{Backend, NewReservation, NodeFilter, Result, StoreError, VolumeMountRow};

fn marks(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Locks these volumes' rows, in id order, for the rest of the transaction (PostgreSQL;
/// SQLite has one writer): a mount and a removal of one volume wait for each other, and the
/// statement after this one sees what the other committed.
pub(super) async fn lock_volumes(
    conn: &mut AnyConnection,
    backend: Backend,
    ids: &[&str],
) -> Result<()> {
    if ids.is_empty() || backend == Backend::Sqlite {
        return Ok(());
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    let sql = format!(
        "SELECT id FROM volumes WHERE id IN ({}) ORDER BY id FOR UPDATE",
        marks(1, sorted.len())
    );
    let mut q = sqlx::query(&sql);
    for id in sorted {
        q = q.bind(id);
    }
    q.fetch_all(&mut *conn).await?;
    Ok(())
}

/// Checks, under the volumes' locks, that `new` may mount its volumes: each still there, and
/// mounted read-write by no live reservation (read-only: by none read-write). A conflict
/// names the reservation in the way.
pub(super) async fn claim(
    conn: &mut AnyConnection,
    backend: Backend,
    new: &NewReservation,
) -> Result<()> {
    if new.mounts.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = new.mounts.iter().map(|m| m.volume_id.as_str()).collect();
    lock_volumes(conn, backend, &ids).await?;
    let sql = format!(
        "SELECT id, name, state FROM volumes WHERE id IN ({})",
        marks(1, ids.len())
    );
    let mut q = sqlx::query(&sql);
    for id in &ids {
        q = q.bind(*id);
    }
    let states: BTreeMap<String, (String, String)> = q
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| Ok((r.try_get("id")?, (r.try_get("name")?, r.try_get("state")?))))
        .collect::<Result<_>>()?;
    let sql = format!(
        concat!(
            "SELECT m.volume_id, m.reservation_id, m.read_only FROM volume_mounts m
             JOIN reservations r ON r.id = m.reservation_id
             WHERE r.status IN ",
            live_statuses!(),
            " AND m.volume_id IN ({}) ORDER BY m.reservation_id"
        ),
        marks(1, ids.len())
    );
    let mut q = sqlx::query(&sql);
    for id in &ids {
        q = q.bind(*id);
    }
    let users = q.fetch_all(&mut *conn).await?;
    for mount in &new.mounts {
        match states.get(&mount.volume_id) {
            Some((_, state)) if matches!(state.as_str(), "creating" | "ready" | "resizing") => {}
            Some((name, state)) => {
                let state = if state == "deleted" {
                    "deleting"
                } else {
                    state
                };
                return Err(StoreError::Conflict(format!(
                    "volume {name} is {state}; it cannot be mounted"
                )));
            }
            None => return Err(StoreError::not_found("volume", &mount.name)),
        }
        for user in &users {
            if user.try_get::<String, _>("volume_id")? != mount.volume_id {
                continue;
            }
            let theirs_read_only = user.try_get::<i64, _>("read_only")? != 0;
            if !mount.read_only || !theirs_read_only {
                let reservation: String = user.try_get("reservation_id")?;
                let how = if theirs_read_only {
                    "read-only"
                } else {
                    "read-write"
                };
                return Err(StoreError::Conflict(format!(
                    "volume {} is mounted {how} by reservation {reservation}; a volume is mounted read-write by one live reservation, or read-only by any number",
                    mount.name
                )));
            }
        }
    }
    Ok(())
}

/// Adds to `batch` the rows that say reservation `id` mounts its volumes.
pub(super) fn push_mounts(batch: &mut Batch, id: &str, mounts: &[VolumeMountRow]) {
    if mounts.is_empty() {
        return;
    }
    let mut values = Vec::with_capacity(mounts.len());
    let mut args = Vec::with_capacity(mounts.len() * 3);
    for m in mounts {
        let n = args.len();
        values.push(format!("(${}, ${}, ${})", n + 1, n + 2, n + 3));
        args.push(Arg::from(m.volume_id.as_str()));
        args.push(Arg::from(id));
        args.push(Arg::from(i64::from(m.read_only)));
    }
    batch.push(
        format!(
            "INSERT INTO volume_mounts (volume_id, reservation_id, read_only) VALUES {}",
            values.join(", ")
        ),
        args,
    );
}

/// The candidate GPUs of type `key` for a reservation its volumes tie to a node or to the
/// shared storage: every GPU of the type on the placeable nodes that pass `filter` (the used
/// ones too, as placement wants them). Not locked: the claim's compare-and-set decides.
pub(super) async fn filtered_candidates(
    conn: &mut AnyConnection,
    backend: Backend,
    key: &str,
    live_since: i64,
    filter: &NodeFilter,
) -> Result<Candidates> {
    let (node, shared) = match filter {
        NodeFilter::Any => ("", 0_i64),
        NodeFilter::Node(id) => (id.as_str(), 0),
        NodeFilter::SharedVolumes => ("", 1),
    };
    let mut batch = Batch::default();
    let part = batch.push(
        concat!(
            "SELECT g.uuid, g.node_id, g.type_name, g.type_key, g.vram_mb, g.free_mb,
                    g.switch_group, n.name AS node_name
             FROM gpus g JOIN nodes n ON n.id = g.node_id
             WHERE g.type_key = $1 AND ($3 = '' OR n.id = $3)
               AND ($4 = 0 OR n.shared_volumes <> 0) AND ",
            placeable!("$2"),
            " ORDER BY g.node_id, g.free_mb, g.uuid"
        ),
        vec![
            Arg::from(key),
            Arg::from(live_since),
            Arg::from(node),
            Arg::from(shared),
        ],
    );
    let answers = batch.run(conn, backend).await?;
    candidates_in(&answers, part, key)
}

/// The nodes that mount the shared volume storage, for filtering what preemption could free.
pub(super) async fn shared_nodes(conn: &mut AnyConnection) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM nodes WHERE shared_volumes <> 0 ORDER BY id")
            .fetch_all(&mut *conn)
            .await?,
    )
}

/// Why a reservation its volumes tie down waits, in words: where its volumes let it run, and
/// (read now) whether that node can take work.
pub(super) async fn filter_reason(
    conn: &mut AnyConnection,
    new: &NewReservation,
    live_since: i64,
) -> Result<String> {
    match (&new.node_filter, crate::VolumeTie::of(&new.mounts)) {
        (NodeFilter::Node(node), Some(mut tie)) => {
            tie.node_down = node_down(conn, node, live_since).await?;
            Ok(format!("and {}", tie.describe()))
        }
        (filter, _) => Ok(format!("and {}", filter.describe())),
    }
}

/// The state of node `id` in `nodes ls`'s words when it cannot take work now (`lost`,
/// `unreachable`, `draining`, `unverified`, `unhealthy`, or `removed`), none when it can.
pub(super) async fn node_down(
    conn: &mut AnyConnection,
    id: &str,
    live_since: i64,
) -> Result<Option<String>> {
    let row =
        sqlx::query("SELECT status, last_seen_at, verified, healthy FROM nodes WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(row) = row else {
        return Ok(Some("removed".to_owned()));
    };
    let status: String = row.try_get("status")?;
    Ok(if status != "ready" {
        Some(status)
    } else if row.try_get::<i64, _>("last_seen_at")? < live_since {
        Some("unreachable".to_owned())
    } else if row.try_get::<i64, _>("verified")? == 0 {
        Some("unverified".to_owned())
    } else if row.try_get::<i64, _>("healthy")? == 0 {
        Some("unhealthy".to_owned())
    } else {
        None
    })
}
