//! The hourly rollup of GPU telemetry (`gpu_hours`): one upsert per agent sync for all the
//! node's GPUs, read back by the usage reports.

use std::collections::BTreeMap;

use gpurent_types::agent::GpuSample;
use sqlx::{AnyConnection, AnyPool, Row};

use super::from_ts;
use crate::usage_facts::GpuHour;
use crate::Result;

const HOUR_MICROS: i64 = 3_600_000_000;

/// The start of the UTC hour holding `at` (unix microseconds).
pub(crate) fn hour_of(at: i64) -> i64 {
    at - at.rem_euclid(HOUR_MICROS)
}

/// One sample per GPU (a report naming a GPU twice keeps its last), in uuid order; samples of
/// GPUs that fell off the bus say nothing about use and are left out.
pub(crate) fn samples(samples: &[GpuSample]) -> BTreeMap<&str, &GpuSample> {
    samples
        .iter()
        .filter(|s| !s.lost)
        .map(|s| (s.uuid.as_str(), s))
        .collect()
}

/// The upsert of `rows` samples into their GPUs' rows of an hour: the hour is parameter
/// `$hour`, the node `$node`, and each row's uuid, utilisation and memory three parameters from
/// `$first` on (bound by `bind_samples`).
pub(crate) fn upsert_sql(rows: usize, hour: usize, node: usize, first: usize) -> String {
    let values: Vec<String> = (0..rows)
        .map(|i| {
            let p = first + i * 3;
            format!(
                "(${hour}, ${p}, ${node}, 1, ${}, ${}, ${})",
                p + 1,
                p + 2,
                p + 2
            )
        })
        .collect();
    format!(
        "INSERT INTO gpu_hours (hour, gpu_uuid, node_id, samples, util_sum, mem_used_mb_sum,
            mem_max_mb)
         VALUES {}
         ON CONFLICT (hour, gpu_uuid) DO UPDATE SET
            node_id = excluded.node_id,
            samples = gpu_hours.samples + 1,
            util_sum = gpu_hours.util_sum + excluded.util_sum,
            mem_used_mb_sum = gpu_hours.mem_used_mb_sum + excluded.mem_used_mb_sum,
            mem_max_mb = CASE WHEN excluded.mem_max_mb > gpu_hours.mem_max_mb
                THEN excluded.mem_max_mb ELSE gpu_hours.mem_max_mb END",
        values.join(", ")
    )
}

/// Binds each sample's three parameters of `upsert_sql`, in its order.
pub(crate) fn bind_samples<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    samples: &BTreeMap<&'q str, &GpuSample>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    for (uuid, s) in samples {
        q = q
            .bind(*uuid)
            .bind(i64::from(s.utilization_pct.min(100)))
            .bind(i64::try_from(s.memory_used_mb).unwrap_or(i64::MAX));
    }
    q
}

/// Adds one sync's samples to their GPUs' rows of the hour of `at`, in one statement. Rows are
/// written in uuid order, so that two syncs naming the same GPUs lock them in the same order.
pub(crate) async fn record(
    conn: &mut AnyConnection,
    node_id: &str,
    samples: &[GpuSample],
    at: i64,
) -> Result<()> {
    let by_uuid = self::samples(samples);
    if by_uuid.is_empty() {
        return Ok(());
    }
    let sql = upsert_sql(by_uuid.len(), 1, 2, 3);
    let q = sqlx::query(&sql).bind(hour_of(at)).bind(node_id);
    bind_samples(q, &by_uuid).execute(&mut *conn).await?;
    Ok(())
}

/// The rows of the hours starting in [from, to) (unix microseconds), by hour and GPU.
pub(crate) async fn read(pool: &AnyPool, from: i64, to: i64) -> Result<Vec<GpuHour>> {
    sqlx::query(
        "SELECT hour, gpu_uuid, samples, util_sum, mem_used_mb_sum, mem_max_mb FROM gpu_hours
         WHERE hour >= $1 AND hour < $2 ORDER BY hour, gpu_uuid",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?
    .iter()
    .map(|r| {
        Ok(GpuHour {
            gpu_uuid: r.try_get("gpu_uuid")?,
            hour: from_ts(r.try_get("hour")?)?,
            samples: r.try_get("samples")?,
            util_sum: r.try_get("util_sum")?,
            mem_used_mb_sum: r.try_get("mem_used_mb_sum")?,
            mem_max_mb: r.try_get("mem_max_mb")?,
        })
    })
    .collect()
}

/// Deletes the rows of the hours before `before` (unix microseconds): a range of the key.
pub(crate) async fn prune(pool: &AnyPool, before: i64) -> Result<u64> {
    Ok(sqlx::query("DELETE FROM gpu_hours WHERE hour < $1")
        .bind(before)
        .execute(pool)
        .await?
        .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_start_on_the_hour() {
        assert_eq!(hour_of(0), 0);
        assert_eq!(hour_of(HOUR_MICROS - 1), 0);
        assert_eq!(hour_of(HOUR_MICROS), HOUR_MICROS);
        assert_eq!(hour_of(-1), -HOUR_MICROS);
    }
}
