//! Benchmarks only: running reservations and volumes written in bulk, for `bench settle` and
//! `bench backup` to settle and copy.

use chrono::{DateTime, Utc};

use super::{ledger, multi_row, new_id, ts, SqlStore};
use crate::Result;

impl SqlStore {
    /// Benchmarks only: `n` running reservations of one tenant on one node, started at
    /// `started_at`, written in bulk (no GPUs are allocated to them; hosts get 80%), each
    /// holding its first hour.
    pub async fn seed_running_reservations(
        &self,
        tenant_id: &str,
        node_id: &str,
        n: usize,
        price_per_hour: gpurent_types::Money,
        started_at: DateTime<Utc>,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let at = ts(started_at);
        let ids: Vec<String> = (0..n).map(|_| new_id()).collect();
        multi_row(
            &mut tx,
            n,
            5,
            "INSERT INTO reservations (id, tenant_id, status, gpu_type, gpu_count, tier,
                price_per_hour, duration_s, node_id, gpus, epoch, command, env, created_at,
                started_at, host_share_bps) SELECT v.column1, v.column2,
                'running', 'RTX4090', 1, 'on-demand', v.column3, 86400, v.column4, '[]', 1, '[]',
                '{}', v.column5, v.column5, 8000 FROM (VALUES ",
            ") AS v",
            |i, q| {
                q.bind(ids[i].clone())
                    .bind(tenant_id.to_owned())
                    .bind(price_per_hour.micros())
                    .bind(node_id.to_owned())
                    .bind(at)
            },
        )
        .await?;
        sqlx::query(
            "INSERT INTO meters (reservation_id, tenant_id, node_id, prepaid_block, price_per_hour,
                duration_s, host_share_bps, started_at, charged, held, settled_until)
             SELECT id, tenant_id, node_id, 0, price_per_hour, duration_s, host_share_bps,
                started_at, 0, price_per_hour, started_at
             FROM reservations WHERE tenant_id = $1 AND node_id = $2 AND status = 'running'",
        )
        .bind(tenant_id)
        .bind(node_id)
        .execute(&mut *tx)
        .await?;
        // Each holds its first hour, as `reserve` does, given back at the first settlement.
        sqlx::query(
            "INSERT INTO transfers (id, debit_account, credit_account, amount, reservation_id,
                created_at, kind)
             SELECT 'hold:' || reservation_id, $1, $2, held, reservation_id, $3, 'hold'
             FROM meters WHERE tenant_id = $4 AND node_id = $5",
        )
        .bind(ledger::user_account(tenant_id))
        .bind(ledger::hold_account(tenant_id))
        .bind(at)
        .bind(tenant_id)
        .bind(node_id)
        .execute(&mut *tx)
        .await?;
        let held = price_per_hour.micros() * i64::try_from(n).unwrap_or(i64::MAX);
        ledger::add(&mut tx, &ledger::hold_account(tenant_id), held).await?;
        ledger::add(&mut tx, &ledger::user_account(tenant_id), -held).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Benchmarks only: `n` ready node-local volumes of `size_bytes` of one tenant on one
    /// node, made at `made_at` at `per_gb_month`, written in bulk (billed from then; their
    /// node's owner earns 80%).
    pub async fn seed_volumes(
        &self,
        tenant_id: &str,
        node_id: &str,
        n: usize,
        size_bytes: u64,
        per_gb_month: gpurent_types::Money,
        made_at: DateTime<Utc>,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let at = ts(made_at);
        let size = i64::try_from(size_bytes).unwrap_or(i64::MAX);
        multi_row(
            &mut tx,
            n,
            7,
            "INSERT INTO volumes (id, owner_id, name, kind, node_id, size_bytes, made_bytes,
                used_bytes, state, created_at, price_per_gb_month, host_share_bps, billed_from,
                billed_until)
             SELECT v.column1, v.column2, v.column3, 'local', v.column4, v.column5, v.column5, 0,
                'ready', v.column6, v.column7, 8000, v.column6, v.column6 FROM (VALUES ",
            ") AS v",
            |i, q| {
                q.bind(new_id())
                    .bind(tenant_id.to_owned())
                    .bind(format!("bench-{i}"))
                    .bind(node_id.to_owned())
                    .bind(size)
                    .bind(at)
                    .bind(per_gb_month.micros())
            },
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
