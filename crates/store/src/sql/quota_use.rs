//! What each quota's tenant holds of its type (`quotas.used`, milli-GPUs: each allocation's
//! memory over its card's), kept as allocations are made and given back, so that a placement
//! reads one row instead of summing the tenant's live work; and the check that it matches that
//! sum, with the books.

use sqlx::{AnyConnection, AnyPool, Row};

use gpurent_sched::Plan;

use super::batch::{Arg, Batch};
use crate::Result;

/// Adds to `batch` the growth of the quotas that new placements count against, each (its
/// tenant id, its plan), summed per tenant and type as [`release`] takes them back. One
/// statement, each quota's row changed once; nothing where the tenant has no quota of the type.
pub(super) fn push_use(batch: &mut Batch, placements: &[(&str, &Plan)]) {
    let allocations: Vec<(&str, &str, u64)> = placements
        .iter()
        .flat_map(|(tenant, plan)| {
            plan.gpus
                .iter()
                .map(move |(u, mb)| (*tenant, u.as_str(), *mb))
        })
        .collect();
    if allocations.is_empty() {
        return;
    }
    let mut values = Vec::with_capacity(allocations.len());
    let mut args = Vec::with_capacity(allocations.len() * 3);
    for (tenant, uuid, mb) in &allocations {
        let n = args.len();
        values.push(format!(
            "(${}, ${}, CAST(${} AS BIGINT))",
            n + 1,
            n + 2,
            n + 3
        ));
        args.push(Arg::from(*tenant));
        args.push(Arg::from(*uuid));
        args.push(Arg::from(i64::try_from(*mb).unwrap_or(i64::MAX)));
    }
    batch.push(
        format!(
            "UPDATE quotas SET used = used + c.milli
             FROM (SELECT v.column1 AS tenant_id, g.type_key,
                          CAST(SUM(v.column3 * 1000 / g.vram_mb) AS BIGINT) AS milli
                   FROM gpus g JOIN (VALUES {}) AS v ON g.uuid = v.column2
                   WHERE g.vram_mb > 0 GROUP BY v.column1, g.type_key) AS c
             WHERE quotas.tenant_id = c.tenant_id AND quotas.type_key = c.type_key",
            values.join(", ")
        ),
        args,
    );
}

/// Takes a reservation's allocations, about to be given back, off its tenant's quotas (never
/// below zero).
pub(super) async fn release(conn: &mut AnyConnection, reservation_id: &str) -> Result<()> {
    sqlx::query(
        "UPDATE quotas SET used = CASE WHEN used > c.milli THEN used - c.milli ELSE 0 END
         FROM (SELECT r.tenant_id, g.type_key,
                      CAST(SUM(a.vram_mb * 1000 / g.vram_mb) AS BIGINT) AS milli
               FROM allocations a JOIN gpus g ON g.uuid = a.gpu_uuid
               JOIN reservations r ON r.id = a.reservation_id
               WHERE a.reservation_id = $1 AND g.vram_mb > 0
               GROUP BY r.tenant_id, g.type_key) AS c
         WHERE quotas.tenant_id = c.tenant_id AND quotas.type_key = c.type_key",
    )
    .bind(reservation_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Quotas whose kept use differs from what their tenant's live work holds.
pub(super) async fn problems(pool: &AnyPool) -> Result<Vec<String>> {
    let rows =
        sqlx::query("SELECT tenant_id, type_key, used FROM quotas ORDER BY tenant_id, type_key")
            .fetch_all(pool)
            .await?;
    let mut out = Vec::new();
    for r in rows {
        let tenant: String = r.try_get("tenant_id")?;
        let key: String = r.try_get("type_key")?;
        let used: i64 = r.try_get("used")?;
        // The sum a quota starts from when it is set (`quotas::USED`).
        let held: i64 = sqlx::query_scalar(super::quotas::USED)
            .bind(&tenant)
            .bind(&key)
            .fetch_one(pool)
            .await?;
        if used != held {
            out.push(format!(
                "quota of {tenant} for {key}: {used} milli-GPUs kept as used, {held} held"
            ));
        }
    }
    Ok(out)
}
