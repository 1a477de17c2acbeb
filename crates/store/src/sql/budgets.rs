//! Budgets in SQL: the `budgets` row of a tenant, its month's spend (the charges `usage`
//! counts) and burn, the alerts fired once each (`budget_alerts`' primary key), the refusal
//! mark read with the caps (`users.over_budget`) and the stops at the limit.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_billing::budget::{month_of, Budget};
use gpurent_types::Money;
use sqlx::Row;

use super::{from_ts, ledger, ts, SqlStore};
use crate::{BudgetFacts, BudgetStore, Result, Scope, StoreError};

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("budgets: {e}"))
}

fn budget_from_row(row: &sqlx::any::AnyRow) -> Result<Budget> {
    let alert_at: String = row.try_get("alert_at")?;
    let alert_at = alert_at
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().map_err(corrupt))
        .collect::<Result<Vec<u32>>>()?;
    let hours: i64 = row.try_get("low_balance_hours")?;
    Budget::new(
        Money::from_micros(row.try_get("monthly")?),
        &alert_at,
        row.try_get::<i64, _>("stop_at_limit")? != 0,
        u32::try_from(hours).map_err(corrupt)?,
    )
    .map_err(corrupt)
}

#[async_trait]
impl BudgetStore for SqlStore {
    async fn set_budget(&self, tenant_id: &str, budget: &Budget, now: DateTime<Utc>) -> Result<()> {
        let alert_at = budget
            .alert_at
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        sqlx::query(
            "INSERT INTO budgets (tenant_id, monthly, alert_at, stop_at_limit, low_balance_hours,
                 set_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (tenant_id) DO UPDATE SET monthly = excluded.monthly,
                 alert_at = excluded.alert_at, stop_at_limit = excluded.stop_at_limit,
                 low_balance_hours = excluded.low_balance_hours, set_at = excluded.set_at",
        )
        .bind(tenant_id)
        .bind(budget.monthly.micros())
        .bind(alert_at)
        .bind(i64::from(budget.stop_at_limit))
        .bind(i64::from(budget.low_balance_hours))
        .bind(ts(now))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn remove_budget(&self, tenant_id: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        let removed = sqlx::query("DELETE FROM budgets WHERE tenant_id = $1")
            .bind(tenant_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("UPDATE users SET over_budget = NULL WHERE id = $1")
            .bind(tenant_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(removed > 0)
    }

    async fn budget_facts(
        &self,
        tenant_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<BudgetFacts>> {
        let Some(row) = sqlx::query(
            "SELECT b.monthly, b.alert_at, b.stop_at_limit, b.low_balance_hours, u.over_budget,
                    a.balance
             FROM budgets b JOIN users u ON u.id = b.tenant_id
             JOIN accounts a ON a.id = 'user:' || b.tenant_id
             WHERE b.tenant_id = $1",
        )
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let budget = budget_from_row(&row)?;
        let (first, _, month) = month_of(now);
        let over: Option<String> = row.try_get("over_budget")?;
        // Exactly the charges `usage` and the invoice count (reservations' and storage).
        let spent: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM transfers
             WHERE debit_account IN ($1, $2) AND kind = 'charge' AND created_at >= $3",
        )
        .bind(ledger::user_account(tenant_id))
        .bind(ledger::hold_account(tenant_id))
        .bind(ts(first))
        .fetch_one(&self.pool)
        .await?;
        let burn: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(price_per_hour), 0) AS BIGINT) FROM reservations
             WHERE tenant_id = $1 AND status IN ('starting', 'running')",
        )
        .bind(tenant_id)
        .fetch_one(&self.pool)
        .await?;
        let fired = sqlx::query(
            "SELECT alert, spent, fired_at FROM budget_alerts
             WHERE tenant_id = $1 AND month = $2 ORDER BY fired_at, LENGTH(alert), alert",
        )
        .bind(tenant_id)
        .bind(&month)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            Ok((
                r.try_get("alert")?,
                Money::from_micros(r.try_get("spent")?),
                from_ts(r.try_get("fired_at")?)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
        Ok(Some(BudgetFacts {
            tenant_id: tenant_id.to_owned(),
            budget,
            spent: Money::from_micros(spent),
            burn_per_hour: Money::from_micros(burn),
            balance: Money::from_micros(row.try_get("balance")?),
            fired,
            over: over.as_deref() == Some(month.as_str()),
        }))
    }

    async fn budget_tenants(&self) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT tenant_id FROM budgets ORDER BY tenant_id")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn fire_budget_alert(
        &self,
        tenant_id: &str,
        month: &str,
        alert: &str,
        spent: Money,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let inserted = sqlx::query(
            "INSERT INTO budget_alerts (tenant_id, month, alert, spent, fired_at)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(tenant_id)
        .bind(month)
        .bind(alert)
        .bind(spent.micros())
        .bind(ts(now))
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn set_over_budget(&self, tenant_id: &str, month: Option<&str>) -> Result<()> {
        sqlx::query("UPDATE users SET over_budget = $1 WHERE id = $2")
            .bind(month)
            .bind(tenant_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn stop_for_budget(&self, tenant_id: &str, now: DateTime<Utc>) -> Result<Vec<String>> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM reservations
             WHERE tenant_id = $1 AND status IN ('starting', 'running') AND tier <> 'reserved'
             ORDER BY id",
        )
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        let mut nodes = Vec::new();
        for id in ids {
            let (_, node) = self
                .stop_with_reason(&id, &Scope::All, now, "budget")
                .await?;
            nodes.extend(node);
        }
        nodes.sort();
        nodes.dedup();
        Ok(nodes)
    }
}
