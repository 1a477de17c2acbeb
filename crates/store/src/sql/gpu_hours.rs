//! The hourly rollup of GPU telemetry (`gpu_hours`): every agent sync's samples added up in
//! memory (`Pending`), written in one statement a minute for the whole fleet (`flush`) instead
//! of one upsert per sync, and read back by the usage reports (after a flush).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use gpurent_types::agent::GpuSample;
use sqlx::{AnyPool, Row};

use super::from_ts;
use crate::usage_facts::GpuHour;
use crate::{Backend, Result};

/// How often the samples added up in memory are written. A replica that crashes loses at most
/// this much of its syncs' samples (utilisation statistics; nothing billed depends on them).
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(60);

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

/// One GPU's sums over an hour's samples, as `gpu_hours` keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sums {
    /// The node that reported the GPU last.
    node_id: String,
    samples: i64,
    util_sum: i64,
    mem_used_mb_sum: i64,
    mem_max_mb: i64,
}

impl Sums {
    fn merge(&mut self, other: &Sums) {
        self.node_id.clone_from(&other.node_id);
        self.samples += other.samples;
        self.util_sum += other.util_sum;
        self.mem_used_mb_sum += other.mem_used_mb_sum;
        self.mem_max_mb = self.mem_max_mb.max(other.mem_max_mb);
    }
}

/// Samples not written yet, by hour and GPU uuid (in the order `flush` writes and locks them).
type Rollup = BTreeMap<(i64, String), Sums>;

/// The samples of this store's syncs since the last flush.
#[derive(Debug, Default)]
pub(crate) struct Pending(Mutex<Rollup>);

impl Pending {
    fn with<R>(&self, f: impl FnOnce(&mut Rollup) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Adds one sync's samples (taken at `at`, unix microseconds) to their GPUs' hour.
    pub(crate) fn add(&self, node_id: &str, samples: &[GpuSample], at: i64) {
        let hour = hour_of(at);
        let by_uuid = self::samples(samples);
        if by_uuid.is_empty() {
            return;
        }
        self.with(|rollup| {
            for (uuid, s) in by_uuid {
                let used = i64::try_from(s.memory_used_mb).unwrap_or(i64::MAX);
                let one = Sums {
                    node_id: node_id.to_owned(),
                    samples: 1,
                    util_sum: i64::from(s.utilization_pct.min(100)),
                    mem_used_mb_sum: used,
                    mem_max_mb: used,
                };
                rollup
                    .entry((hour, uuid.to_owned()))
                    .and_modify(|sums| sums.merge(&one))
                    .or_insert(one);
            }
        });
    }

    fn take(&self) -> Rollup {
        self.with(std::mem::take)
    }

    /// Puts back what a failed flush took, merged with what came since.
    fn put_back(&self, taken: Rollup) {
        self.with(|rollup| {
            for (key, mut sums) in taken {
                // What came since is newer: it is merged into the older sums (its node wins).
                if let Some(newer) = rollup.get(&key) {
                    sums.merge(newer);
                }
                rollup.insert(key, sums);
            }
        });
    }
}

/// Writes the samples added up since the last flush, in one transaction. What fails before the
/// commit is kept for the next flush; a commit whose answer is lost is not written again
/// (counting a minute twice would be worse than missing it; it is logged).
pub(crate) async fn flush(pool: &AnyPool, backend: Backend, pending: &Pending) -> Result<()> {
    let taken = pending.take();
    if taken.is_empty() {
        return Ok(());
    }
    let rows: Vec<(&(i64, String), &Sums)> = taken.iter().collect();
    let written = async {
        let mut tx = super::begin_on(pool, backend).await?;
        super::multi_row(
            &mut tx,
            rows.len(),
            7,
            "INSERT INTO gpu_hours (hour, gpu_uuid, node_id, samples, util_sum, mem_used_mb_sum,
                mem_max_mb) VALUES ",
            " ON CONFLICT (hour, gpu_uuid) DO UPDATE SET
                node_id = excluded.node_id,
                samples = gpu_hours.samples + excluded.samples,
                util_sum = gpu_hours.util_sum + excluded.util_sum,
                mem_used_mb_sum = gpu_hours.mem_used_mb_sum + excluded.mem_used_mb_sum,
                mem_max_mb = CASE WHEN excluded.mem_max_mb > gpu_hours.mem_max_mb
                    THEN excluded.mem_max_mb ELSE gpu_hours.mem_max_mb END",
            |i, q| {
                let ((hour, uuid), sums) = rows[i];
                q.bind(*hour)
                    .bind(uuid.clone())
                    .bind(sums.node_id.clone())
                    .bind(sums.samples)
                    .bind(sums.util_sum)
                    .bind(sums.mem_used_mb_sum)
                    .bind(sums.mem_max_mb)
            },
        )
        .await?;
        Ok::<_, crate::StoreError>(tx)
    }
    .await;
    let tx = match written {
        Ok(tx) => tx,
        Err(e) => {
            pending.put_back(taken);
            return Err(e);
        }
    };
    if let Err(e) = tx.commit().await {
        tracing::warn!(error = %e, rows = taken.len(), "the GPU-hour rollup's commit failed; its samples may be missing");
        return Err(e.into());
    }
    Ok(())
}

/// The task that flushes every `FLUSH_EVERY`; stopped when the last store clone drops it.
#[derive(Debug)]
pub(crate) struct Flusher(tokio::task::JoinHandle<()>);

impl Flusher {
    pub(crate) fn start(pool: AnyPool, backend: Backend, pending: std::sync::Arc<Pending>) -> Self {
        Flusher(tokio::spawn(async move {
            loop {
                tokio::time::sleep(FLUSH_EVERY).await;
                if pool.is_closed() {
                    return;
                }
                if let Err(e) = flush(&pool, backend, &pending).await {
                    tracing::warn!(error = %e, "cannot write the GPU-hour rollup; trying again in a minute");
                }
            }
        }))
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.0.abort();
    }
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
    .map(row)
    .collect()
}

/// The rows of these GPUs (by uuid) of the hours starting in [from, to) (unix microseconds),
/// by hour and GPU. The key's range of hours, then its GPUs: a reservation's few of them.
pub(crate) async fn read_of(
    pool: &AnyPool,
    gpus: &[String],
    from: i64,
    to: i64,
) -> Result<Vec<GpuHour>> {
    if gpus.is_empty() || from >= to {
        return Ok(Vec::new());
    }
    let list = (0..gpus.len())
        .map(|i| format!("${}", i + 3))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT hour, gpu_uuid, samples, util_sum, mem_used_mb_sum, mem_max_mb FROM gpu_hours
         WHERE hour >= $1 AND hour < $2 AND gpu_uuid IN ({list}) ORDER BY hour, gpu_uuid"
    );
    let mut query = sqlx::query(&sql).bind(from).bind(to);
    for uuid in gpus {
        query = query.bind(uuid.as_str());
    }
    query.fetch_all(pool).await?.iter().map(row).collect()
}

fn row(r: &sqlx::any::AnyRow) -> Result<GpuHour> {
    Ok(GpuHour {
        gpu_uuid: r.try_get("gpu_uuid")?,
        hour: from_ts(r.try_get("hour")?)?,
        samples: r.try_get("samples")?,
        util_sum: r.try_get("util_sum")?,
        mem_used_mb_sum: r.try_get("mem_used_mb_sum")?,
        mem_max_mb: r.try_get("mem_max_mb")?,
    })
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

    fn sample(uuid: &str, util: u32, used_mb: u64) -> GpuSample {
        GpuSample {
            uuid: uuid.to_owned(),
            utilization_pct: util,
            memory_used_mb: used_mb,
            temperature_c: 40,
            power_mw: 100_000,
            ecc_uncorrected: 0,
            memory_total_mb: 24_576,
            xid_errors: vec![],
            lost: false,
            processes: vec![],
        }
    }

    #[test]
    fn a_failed_flush_puts_back_what_it_took_beside_what_came_since() {
        let pending = Pending::default();
        pending.add("n1", &[sample("g0", 100, 10), sample("g1", 150, 5)], 0);
        let taken = pending.take();
        pending.add("n2", &[sample("g0", 20, 30)], 1);
        pending.put_back(taken);
        let rollup = pending.take();
        let g0 = &rollup[&(0, "g0".to_owned())];
        assert_eq!(
            (
                g0.node_id.as_str(),
                g0.samples,
                g0.util_sum,
                g0.mem_used_mb_sum,
                g0.mem_max_mb
            ),
            ("n2", 2, 120, 40, 30),
            "the later sample's node, both samples"
        );
        let g1 = &rollup[&(0, "g1".to_owned())];
        assert_eq!(
            (g1.samples, g1.util_sum),
            (1, 100),
            "utilisation capped at 100"
        );
        assert!(pending.take().is_empty());
    }

    #[test]
    fn hours_start_on_the_hour() {
        assert_eq!(hour_of(0), 0);
        assert_eq!(hour_of(HOUR_MICROS - 1), 0);
        assert_eq!(hour_of(HOUR_MICROS), HOUR_MICROS);
        assert_eq!(hour_of(-1), -HOUR_MICROS);
    }
}
