//! The figures of the control plane's `/metrics`, read at scrape time in one query (one
//! snapshot, one round trip): a `UNION ALL` of small aggregates, one row per labelled value.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::{Money, Tier};
use sqlx::Row;

use super::ledger::PLATFORM_REVENUE;
use super::statements::spot_stats_of;
use super::{from_ts, ts, SqlStore};
use crate::{MetricsStore, MetricsView, Result};

/// Every row is (kind, a, b, c, n, x, y): what the row counts, up to three labels and up to
/// three numbers. The gross charges are read from the cached balances, not by summing every
/// charge transfer: every charge credits `platform:revenue` and only host earnings are paid
/// out of it, and nothing leaves an `earnings:` account, so revenue plus earnings is
/// everything charged (`ledger-check` verifies the balances against the transfers).
const METRICS_QUERY: &str = "
    SELECT 'reservation' AS kind, status AS a, tier AS b, COALESCE(end_reason, '') AS c,
           CAST(COUNT(*) AS BIGINT) AS n,
           CAST(SUM(CASE WHEN started_at IS NOT NULL THEN 1 ELSE 0 END) AS BIGINT) AS x,
           CAST(0 AS BIGINT) AS y
    FROM reservations GROUP BY status, tier, end_reason
    UNION ALL
    SELECT 'queued', gpu_type, '', '', CAST(COUNT(*) AS BIGINT), CAST(MIN(queued_at) AS BIGINT),
           CAST(0 AS BIGINT)
    FROM reservations WHERE status = 'pending' AND node_id IS NULL GROUP BY gpu_type
    UNION ALL
    SELECT 'gpus', g.type_name, CASE WHEN g.free_mb = g.vram_mb THEN 'free' ELSE 'allocated' END,
           '', CAST(COUNT(*) AS BIGINT), CAST(SUM(g.vram_mb) AS BIGINT),
           CAST(SUM(g.free_mb) AS BIGINT)
    FROM gpus g JOIN nodes n ON n.id = g.node_id
    WHERE n.last_seen_at >= $1 AND n.status <> 'lost'
    GROUP BY g.type_name, CASE WHEN g.free_mb = g.vram_mb THEN 'free' ELSE 'allocated' END
    UNION ALL
    SELECT 'node', s.shown, '', '', CAST(COUNT(*) AS BIGINT), CAST(0 AS BIGINT),
           CAST(0 AS BIGINT)
    FROM (SELECT CASE WHEN status <> 'ready' THEN status
                      WHEN last_seen_at < $1 THEN 'unreachable'
                      WHEN verified = 0 THEN 'unverified'
                      WHEN healthy = 0 THEN 'unhealthy'
                      ELSE 'ready' END AS shown
          FROM nodes) s
    GROUP BY s.shown
    UNION ALL
    SELECT 'account', CASE WHEN id = $2 THEN 'revenue' ELSE 'earnings' END, '', '',
           CAST(COUNT(*) AS BIGINT), CAST(SUM(balance) AS BIGINT), CAST(0 AS BIGINT)
    FROM accounts WHERE id = $2 OR id LIKE 'earnings:%'
    GROUP BY CASE WHEN id = $2 THEN 'revenue' ELSE 'earnings' END";

/// Statuses a reservation ends in.
const ENDED: [&str; 5] = ["stopped", "failed", "preempted", "lost", "expired"];

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[async_trait]
impl MetricsStore for SqlStore {
    async fn metrics_view(&self, live_since: DateTime<Utc>) -> Result<MetricsView> {
        let rows = sqlx::query(METRICS_QUERY)
            .bind(ts(live_since))
            .bind(PLATFORM_REVENUE)
            .fetch_all(&self.pool)
            .await?;
        let mut view = MetricsView::default();
        let mut spot_ended: BTreeMap<String, u64> = BTreeMap::new();
        let (mut revenue, mut earnings) = (0_i64, 0_i64);
        for row in rows {
            let kind: String = row.try_get("kind")?;
            let a: String = row.try_get("a")?;
            let b: String = row.try_get("b")?;
            let c: String = row.try_get("c")?;
            let n = count(row.try_get("n")?);
            let x: Option<i64> = row.try_get("x")?;
            let y: Option<i64> = row.try_get("y")?;
            match kind.as_str() {
                "reservation" => {
                    if c == "preempted" {
                        view.preempted += n;
                    }
                    if b == Tier::Spot.as_str() && ENDED.contains(&a.as_str()) {
                        // Only those that ran count for the spot success rate.
                        *spot_ended.entry(c).or_default() += count(x.unwrap_or(0));
                    }
                    *view.reservations.entry((a, b)).or_default() += n;
                }
                "queued" => {
                    let oldest = x.map(from_ts).transpose()?;
                    view.queued.insert(a, (n, oldest));
                }
                "gpus" => {
                    let gpus = view.gpus.entry(a).or_default();
                    if b == "free" {
                        gpus.free += n;
                    } else {
                        gpus.allocated += n;
                    }
                    gpus.vram_mb += count(x.unwrap_or(0));
                    gpus.free_mb += count(y.unwrap_or(0));
                }
                "node" => {
                    view.nodes.insert(a, n);
                }
                "account" if a == "revenue" => revenue = x.unwrap_or(0),
                "account" => earnings = x.unwrap_or(0),
                _ => {}
            }
        }
        spot_ended.retain(|_, n| *n > 0);
        view.spot = spot_stats_of(&spot_ended);
        view.charged = Money::from_micros(revenue.saturating_add(earnings));
        view.host_earnings = Money::from_micros(earnings);
        Ok(view)
    }
}
