//! Quotas in SQL: the `quotas` rows, what a tenant's live work holds of a type (milli-GPUs:
//! each allocation's memory over its card's, kept in `quotas.used` by `quota_use.rs`), and
//! where a new reservation stands, read in its placement transaction with the quota's row
//! locked on PostgreSQL, so two placements never both count the same room.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_sched::quota::{self, Quota, Standing};
use sqlx::{AnyConnection, Row};

use super::{from_ts, ts, Backend, SqlStore};
use crate::{NewReservation, QuotaRow, QuotaStore, Result, StoreError};

fn milli(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn stored(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Milli-GPUs of type `key` that `tenant_id`'s live work holds, summed: what `quotas.used`
/// keeps (`quota_use.rs`), read when a quota is set and when the books are checked.
pub(super) const USED: &str =
    "SELECT CAST(COALESCE(SUM(a.vram_mb * 1000 / g.vram_mb), 0) AS BIGINT)
     FROM reservations r JOIN allocations a ON a.reservation_id = r.id
     JOIN gpus g ON g.uuid = a.gpu_uuid
     WHERE r.tenant_id = $1 AND g.type_key = $2 AND g.vram_mb > 0
       AND r.status IN ('pending', 'starting', 'running', 'stopping')";

/// Where `new` stands against the quotas of its type: one read when the type has none;
/// `LimitExceeded` past its tenant's quota and borrow limit.
pub(super) async fn standing_of(
    conn: &mut AnyConnection,
    backend: Backend,
    new: &NewReservation,
) -> Result<Standing> {
    standing_for(conn, backend, &new.tenant_id, new.gpu_type.key(), new.want).await
}

/// Where work of `tenant_id` asking `want` of type `key` stands (a share sized against the
/// type's largest card).
pub(super) async fn standing_for(
    conn: &mut AnyConnection,
    backend: Backend,
    tenant_id: &str,
    key: &str,
    want: gpurent_sched::Request,
) -> Result<Standing> {
    let row = sqlx::query(
        "SELECT (SELECT COUNT(*) FROM quotas WHERE type_key = $1) AS managed,
                q.guaranteed, q.borrow_limit
         FROM (SELECT 1 AS one) x LEFT JOIN quotas q ON q.type_key = $1 AND q.tenant_id = $2",
    )
    .bind(key)
    .bind(tenant_id)
    .fetch_one(&mut *conn)
    .await?;
    let managed: i64 = row.try_get("managed")?;
    if managed == 0 {
        return Ok(Standing::Unmanaged);
    }
    // No quota of a type with quotas (or none since, read under its lock): whatever it takes
    // is borrowed, however much.
    if quota_in(&row)?.is_none() {
        return Ok(Standing::Borrowed);
    }
    let Some(held) = held_for(conn, backend, tenant_id, key).await? else {
        return Ok(Standing::Borrowed);
    };
    quota::standing(
        true,
        Some(held.quota),
        held.used,
        quota::asked(want, held.card_vram_mb),
    )
    .map_err(|e| StoreError::LimitExceeded(e.to_string()))
}

/// A tenant's quota of a type and what its live work holds of it, as [`held_for`] reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub quota: Quota,
    /// Milli-GPUs its live work holds.
    pub used: u64,
    /// The type's largest card, which a share is sized against.
    pub card_vram_mb: u64,
}

fn quota_in(row: &sqlx::any::AnyRow) -> Result<Option<Quota>> {
    row.try_get::<Option<i64>, _>("guaranteed")?
        .map(|g| -> Result<Quota> {
            Ok(Quota {
                guaranteed: milli(g),
                borrow_limit: row.try_get::<Option<i64>, _>("borrow_limit")?.map(milli),
            })
        })
        .transpose()
}

/// The quota of `tenant_id` of managed type `key` with what it holds (kept as allocations
/// come and go, `quota_use.rs`: one row, not a sum of live work), its row locked for the
/// transaction (PostgreSQL; SQLite has one writer), so that placements counting the same room
/// commit one at a time; `None` when it has none (its work there is borrowed). One query.
pub(super) async fn held_for(
    conn: &mut AnyConnection,
    backend: Backend,
    tenant_id: &str,
    key: &str,
) -> Result<Option<Held>> {
    let row = sqlx::query(&format!(
        "SELECT q.guaranteed, q.borrow_limit, q.used,
                (SELECT MAX(g.vram_mb) FROM gpus g WHERE g.type_key = $1) AS card
         FROM quotas q WHERE q.type_key = $1 AND q.tenant_id = $2{}",
        if backend == Backend::Postgres {
            " FOR UPDATE OF q"
        } else {
            ""
        }
    ))
    .bind(key)
    .bind(tenant_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let Some(quota) = quota_in(&row)? else {
        return Ok(None);
    };
    Ok(Some(Held {
        quota,
        used: milli(row.try_get("used")?),
        card_vram_mb: row.try_get::<Option<i64>, _>("card")?.map_or(1, milli),
    }))
}

/// Where queued reservation `id`, about to be placed on GPUs of type `key`, stands, and its
/// tenant.
pub(super) async fn standing_of_queued(
    conn: &mut AnyConnection,
    backend: Backend,
    id: &str,
    key: &str,
) -> Result<(Standing, String)> {
    let row = sqlx::query("SELECT tenant_id, gpu_count, vram_mb FROM reservations WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::not_found("reservation", id))?;
    let tenant: String = row.try_get("tenant_id")?;
    let want = match row.try_get::<Option<i64>, _>("vram_mb")? {
        Some(mb) => gpurent_sched::Request::Share { vram_mb: milli(mb) },
        None => gpurent_sched::Request::Whole {
            count: u32::try_from(row.try_get::<i64, _>("gpu_count")?).unwrap_or(u32::MAX),
        },
    };
    let standing = standing_for(conn, backend, &tenant, key, want).await?;
    Ok((standing, tenant))
}

/// The quotas of the tenants with queued work, with what their live work holds of each type.
pub(super) async fn queued_quotas(conn: &mut AnyConnection) -> Result<Vec<crate::QuotaUse>> {
    let rows = sqlx::query(
        "SELECT q.tenant_id, q.type_key, q.guaranteed, q.borrow_limit, q.used FROM quotas q
         WHERE q.tenant_id IN (SELECT DISTINCT tenant_id FROM reservations
                               WHERE status = 'pending' AND node_id IS NULL)
         ORDER BY q.tenant_id, q.type_key",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let Some(quota) = quota_in(&r)? else { continue };
        out.push(crate::QuotaUse {
            quota,
            used_milli: milli(r.try_get("used")?),
            tenant_id: r.try_get("tenant_id")?,
            type_key: r.try_get("type_key")?,
        });
    }
    Ok(out)
}

/// Placed work of type `key` borrowed beyond its tenant's quota, neither a reserved block nor
/// stopping: (reservation id, tenant id).
pub(super) async fn borrowed_of_type(
    conn: &mut AnyConnection,
    key: &str,
) -> Result<Vec<(String, String)>> {
    let rows = sqlx::query(
        "SELECT id, tenant_id FROM reservations
         WHERE status IN ('pending', 'starting', 'running') AND node_id IS NOT NULL
           AND borrowed = 1 AND tier <> 'reserved' AND type_key = $1
         ORDER BY id",
    )
    .bind(key)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, r.try_get("tenant_id")?)))
        .collect()
}

/// Whether a scheduling pass may stop `victims` for queued reservation `id` of `tenant_id`,
/// whose standing was just read: spot work, or, for work within its quota (`guaranteed`),
/// other tenants' borrowed work but reserved blocks. A pass planned on a view where it was
/// within its quota may find it is no longer (another of its tenant's placements came first).
pub(super) async fn may_stop(
    conn: &mut AnyConnection,
    tenant_id: &str,
    victims: &[String],
    guaranteed: bool,
) -> Result<bool> {
    for victim in victims {
        let row = sqlx::query("SELECT tier, borrowed, tenant_id FROM reservations WHERE id = $1")
            .bind(victim)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(row) = row else { return Ok(false) };
        let tier: String = row.try_get("tier")?;
        let borrowed: i64 = row.try_get("borrowed")?;
        let owner: String = row.try_get("tenant_id")?;
        let reclaimed = guaranteed && borrowed == 1 && tier != "reserved" && owner != tenant_id;
        if tier != "spot" && !reclaimed {
            return Ok(false);
        }
    }
    Ok(true)
}

#[async_trait]
impl QuotaStore for SqlStore {
    async fn set_quota(
        &self,
        tenant_id: &str,
        type_key: &str,
        quota: Quota,
        now: DateTime<Utc>,
    ) -> Result<()> {
        // What it holds now, counted under the quota's row lock, as placements count it.
        let mut tx = self.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query(
                "SELECT tenant_id FROM quotas WHERE tenant_id = $1 AND type_key = $2 FOR UPDATE",
            )
            .bind(tenant_id)
            .bind(type_key)
            .fetch_optional(&mut *tx)
            .await?;
        }
        let used: i64 = sqlx::query_scalar(USED)
            .bind(tenant_id)
            .bind(type_key)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO quotas (tenant_id, type_key, guaranteed, borrow_limit, set_at, used)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (tenant_id, type_key) DO UPDATE SET guaranteed = excluded.guaranteed,
                 borrow_limit = excluded.borrow_limit, set_at = excluded.set_at,
                 used = excluded.used",
        )
        .bind(tenant_id)
        .bind(type_key)
        .bind(stored(quota.guaranteed))
        .bind(quota.borrow_limit.map(stored))
        .bind(ts(now))
        .bind(used)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn remove_quota(&self, tenant_id: &str, type_key: &str) -> Result<bool> {
        let removed = sqlx::query("DELETE FROM quotas WHERE tenant_id = $1 AND type_key = $2")
            .bind(tenant_id)
            .bind(type_key)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(removed > 0)
    }

    async fn quotas(&self) -> Result<Vec<QuotaRow>> {
        let rows = sqlx::query(
            "SELECT q.tenant_id, u.name, q.type_key, q.guaranteed, q.borrow_limit, q.set_at,
                    q.used
             FROM quotas q JOIN users u ON u.id = q.tenant_id ORDER BY q.type_key, u.name",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let Some(quota) = quota_in(&r)? else { continue };
            out.push(QuotaRow {
                tenant_name: r.try_get("name")?,
                quota,
                used: milli(r.try_get("used")?),
                set_at: from_ts(r.try_get("set_at")?)?,
                tenant_id: r.try_get("tenant_id")?,
                type_key: r.try_get("type_key")?,
            });
        }
        Ok(out)
    }
}
