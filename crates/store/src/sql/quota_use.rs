//! What each quota's tenant holds of its type (`quotas.used`, milli-GPUs: each allocation's
//! memory over its card's), kept as allocations are made and given back, so that a placement
//! reads one row instead of summing the tenant's live work; and the check that it matches that
//! sum, with the books.

use sqlx::{AnyConnection, AnyPool, Row};

use super::batch::{Arg, Batch};
use crate::Result;

/// Adds to `batch` the growth of the quotas these new allocations count against, each
/// (tenant id, GPU uuid, MiB), summed per tenant and type as [`release`] takes them back. One
/// statement, each quota's row changed once; nothing where the tenant has no quota of the type.
pub(super) fn push_use(batch: &mut Batch, allocations: &[(&str, &str, u64)]) {
    if allocations.is_empty() {
        return;
    }
    let mut values = Vec::with_capacity(allocations.len());
    let mut args = Vec::with_capacity(allocations.len() * 3);
    for (tenant, uuid, mb) in allocations {
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
    let rows = sqlx::query(
        "SELECT q.tenant_id, q.type_key, q.used,
                CAST(COALESCE((SELECT SUM(a.vram_mb * 1000 / g.vram_mb)
                  FROM reservations r JOIN allocations a ON a.reservation_id = r.id
                  JOIN gpus g ON g.uuid = a.gpu_uuid
                  WHERE r.tenant_id = q.tenant_id AND g.type_key = q.type_key
                    AND g.vram_mb > 0), 0) AS BIGINT) AS held
         FROM quotas q ORDER BY q.tenant_id, q.type_key",
    )
    .fetch_all(pool)
    .await?;
    let mut out = Vec::new();
    for r in rows {
        let (used, held): (i64, i64) = (r.try_get("used")?, r.try_get("held")?);
        if used != held {
            let tenant: String = r.try_get("tenant_id")?;
            let key: String = r.try_get("type_key")?;
            out.push(format!(
                "quota of {tenant} for {key}: {used} milli-GPUs kept as used, {held} held"
            ));
        }
    }
    Ok(out)
}
