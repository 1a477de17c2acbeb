//! Notifications in SQL: webhooks (`notification_hooks`), one delivery per hook and event
//! (`notification_deliveries`' unique key, so replicas queue an event once), claimed by a
//! compare-and-set on `next_at` before it is sent, and every attempt kept.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{DeliveryAttempt, NotificationDelivery, NotificationHook};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::batch::placeholders;
use super::{from_ts, new_id, ts, SqlStore};
use crate::{
    AttemptOutcome, DueDelivery, HookRow, NotificationStore, PlatformEvent, Result, StoreError,
};

const HOOK_COLUMNS: &str =
    "id, owner_id, url, events, secret_sealed, created_by, created_at FROM notification_hooks";

fn hook_from_row(row: &AnyRow) -> Result<HookRow> {
    let events: String = row.try_get("events")?;
    Ok(HookRow {
        hook: NotificationHook {
            id: row.try_get("id")?,
            owner_id: row.try_get("owner_id")?,
            url: row.try_get("url")?,
            events: events.split(',').map(str::to_owned).collect(),
            created_at: from_ts(row.try_get("created_at")?)?,
            secret: None,
        },
        secret_sealed: row.try_get("secret_sealed")?,
        created_by: row.try_get("created_by")?,
    })
}

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

#[async_trait]
impl NotificationStore for SqlStore {
    async fn add_hook(&self, row: &HookRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO notification_hooks (id, owner_id, url, events, secret_sealed,
                 created_by, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&row.hook.id)
        .bind(&row.hook.owner_id)
        .bind(&row.hook.url)
        .bind(row.hook.events.join(","))
        .bind(&row.secret_sealed)
        .bind(&row.created_by)
        .bind(ts(row.hook.created_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn hooks(&self, owner_id: &str) -> Result<Vec<HookRow>> {
        sqlx::query(&format!(
            "SELECT {HOOK_COLUMNS} WHERE owner_id = $1 ORDER BY created_at, id"
        ))
        .bind(owner_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(hook_from_row)
        .collect()
    }

    async fn hook(&self, id: &str) -> Result<Option<HookRow>> {
        sqlx::query(&format!("SELECT {HOOK_COLUMNS} WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(hook_from_row)
            .transpose()
    }

    async fn remove_hook(&self, id: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "DELETE FROM notification_attempts WHERE delivery_id IN
                 (SELECT id FROM notification_deliveries WHERE hook_id = $1)",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM notification_deliveries WHERE hook_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let removed = sqlx::query("DELETE FROM notification_hooks WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(removed > 0)
    }

    async fn enqueue(
        &self,
        owner_id: &str,
        hook_id: Option<&str>,
        kind: &str,
        event_key: &str,
        payload: &str,
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let hooks = self.hooks(owner_id).await?;
        let mut queued = 0;
        for row in hooks {
            let wanted = match hook_id {
                Some(only) => row.hook.id == only,
                None => row.hook.events.iter().any(|e| e == "*" || e == kind),
            };
            if !wanted {
                continue;
            }
            queued += sqlx::query(
                "INSERT INTO notification_deliveries (id, hook_id, event_key, kind, payload,
                     state, attempts, created_at, next_at)
                 VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, $6)
                 ON CONFLICT DO NOTHING",
            )
            .bind(new_id())
            .bind(&row.hook.id)
            .bind(event_key)
            .bind(kind)
            .bind(payload)
            .bind(ts(now))
            .execute(&self.pool)
            .await?
            .rows_affected();
        }
        Ok(queued)
    }

    async fn due_deliveries(&self, now: DateTime<Utc>, limit: u32) -> Result<Vec<DueDelivery>> {
        let rows = sqlx::query(
            "SELECT d.id, d.hook_id, h.url, h.secret_sealed, d.kind, d.payload, d.attempts,
                    d.created_at, d.next_at
             FROM notification_deliveries d JOIN notification_hooks h ON h.id = d.hook_id
             WHERE d.next_at IS NOT NULL AND d.next_at <= $1
             ORDER BY d.next_at, d.id LIMIT $2",
        )
        .bind(ts(now))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(DueDelivery {
                    id: r.try_get("id")?,
                    hook_id: r.try_get("hook_id")?,
                    url: r.try_get("url")?,
                    secret_sealed: r.try_get("secret_sealed")?,
                    kind: r.try_get("kind")?,
                    payload: r.try_get("payload")?,
                    attempts: count(r.try_get("attempts")?),
                    created_at: from_ts(r.try_get("created_at")?)?,
                    next_at: from_ts(r.try_get("next_at")?)?,
                })
            })
            .collect()
    }

    async fn claim_delivery(
        &self,
        id: &str,
        next_at: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool> {
        let claimed = sqlx::query(
            "UPDATE notification_deliveries SET next_at = $1
             WHERE id = $2 AND next_at = $3 AND state = 'pending'",
        )
        .bind(ts(until))
        .bind(id)
        .bind(ts(next_at))
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(claimed == 1)
    }

    async fn record_attempt(
        &self,
        id: &str,
        attempt: u32,
        at: DateTime<Utc>,
        status: Option<u16>,
        error: Option<&str>,
        outcome: AttemptOutcome,
    ) -> Result<()> {
        let (state, next_at) = match outcome {
            AttemptOutcome::Delivered => ("delivered", None),
            AttemptOutcome::Retry(next) => ("pending", Some(ts(next))),
            AttemptOutcome::GiveUp => ("failed", None),
        };
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO notification_attempts (delivery_id, attempt, at, status, error)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(i64::from(attempt))
        .bind(ts(at))
        .bind(status.map(i64::from))
        .bind(error)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE notification_deliveries SET state = $1, next_at = $2, attempts = $3
             WHERE id = $4",
        )
        .bind(state)
        .bind(next_at)
        .bind(i64::from(attempt))
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn prune_deliveries(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "DELETE FROM notification_attempts WHERE delivery_id IN
                 (SELECT id FROM notification_deliveries
                  WHERE state <> 'pending' AND created_at < $1)",
        )
        .bind(ts(before))
        .execute(&mut *tx)
        .await?;
        let pruned = sqlx::query(
            "DELETE FROM notification_deliveries WHERE state <> 'pending' AND created_at < $1",
        )
        .bind(ts(before))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(pruned)
    }

    async fn deliveries(&self, hook_id: &str, limit: u32) -> Result<Vec<NotificationDelivery>> {
        let rows = sqlx::query(
            "SELECT id, hook_id, kind, state, created_at, next_at, payload
             FROM notification_deliveries WHERE hook_id = $1
             ORDER BY created_at DESC, id DESC LIMIT $2",
        )
        .bind(hook_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let id: String = r.try_get("id")?;
            let attempts = sqlx::query(
                "SELECT attempt, at, status, error FROM notification_attempts
                 WHERE delivery_id = $1 ORDER BY attempt",
            )
            .bind(&id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|a| {
                Ok(DeliveryAttempt {
                    attempt: count(a.try_get("attempt")?),
                    at: from_ts(a.try_get("at")?)?,
                    status: a
                        .try_get::<Option<i64>, _>("status")?
                        .and_then(|s| u16::try_from(s).ok()),
                    error: a.try_get("error")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
            let payload: String = r.try_get("payload")?;
            out.push(NotificationDelivery {
                id,
                hook_id: r.try_get("hook_id")?,
                kind: r.try_get("kind")?,
                state: r.try_get("state")?,
                created_at: from_ts(r.try_get("created_at")?)?,
                next_at: r
                    .try_get::<Option<i64>, _>("next_at")?
                    .map(from_ts)
                    .transpose()?,
                payload: serde_json::from_str(&payload)
                    .map_err(|e| StoreError::Corrupt(format!("a delivery's payload: {e}")))?,
                attempts,
            });
        }
        Ok(out)
    }

    async fn platform_events(
        &self,
        since: DateTime<Utc>,
        reasons: &[&str],
    ) -> Result<Vec<PlatformEvent>> {
        let event = |owner: &AnyRow, kind: &'static str, subject: &str, detail: &str, at: &str| {
            Ok::<_, StoreError>(PlatformEvent {
                owner_id: owner.try_get("owner_id")?,
                kind,
                subject: owner.try_get(subject)?,
                detail: owner.try_get(detail)?,
                at: from_ts(owner.try_get(at)?)?,
            })
        };
        let mut events = Vec::new();
        if !reasons.is_empty() {
            let sql = format!(
                "SELECT r.tenant_id AS owner_id, r.id, r.end_reason, r.ended_at
                 FROM reservations r
                 WHERE r.tenant_id IN (SELECT owner_id FROM notification_hooks)
                   AND r.ended_at IS NOT NULL AND r.ended_at >= $1
                   AND r.end_reason IN ({})
                 ORDER BY r.ended_at, r.id",
                placeholders(2, reasons.len())
            );
            let mut query = sqlx::query(&sql).bind(ts(since));
            for reason in reasons {
                query = query.bind(*reason);
            }
            for r in query.fetch_all(&self.pool).await? {
                events.push(event(
                    &r,
                    "reservation_ended",
                    "id",
                    "end_reason",
                    "ended_at",
                )?);
            }
        }
        let placed = sqlx::query(
            "SELECT r.tenant_id AS owner_id, r.id, NULL AS detail, r.placed_at FROM reservations r
             WHERE r.tenant_id IN (SELECT owner_id FROM notification_hooks)
               AND r.queued_at IS NOT NULL AND r.placed_at IS NOT NULL AND r.placed_at >= $1
             ORDER BY r.placed_at, r.id",
        )
        .bind(ts(since))
        .fetch_all(&self.pool)
        .await?;
        for r in placed {
            events.push(event(
                &r,
                "reservation_placed",
                "id",
                "detail",
                "placed_at",
            )?);
        }
        // Each requeue of a managed job sets its `queued_at` (and its epoch): one event each.
        let restarted = sqlx::query(
            "SELECT r.tenant_id AS owner_id, r.id, CAST(r.epoch - 1 AS TEXT) AS detail, r.queued_at
             FROM reservations r
             WHERE r.tenant_id IN (SELECT owner_id FROM notification_hooks)
               AND r.restart_policy <> 'never' AND r.epoch > 1
               AND r.queued_at IS NOT NULL AND r.queued_at >= $1
             ORDER BY r.queued_at, r.id",
        )
        .bind(ts(since))
        .fetch_all(&self.pool)
        .await?;
        for r in restarted {
            events.push(event(
                &r,
                "reservation_restarted",
                "id",
                "detail",
                "queued_at",
            )?);
        }
        let lost = sqlx::query(
            "SELECT n.owner_id, n.id, n.name AS detail, n.lost_at FROM nodes n
             WHERE n.owner_id IN (SELECT owner_id FROM notification_hooks)
               AND n.status = 'lost' AND n.lost_at IS NOT NULL AND n.lost_at >= $1
             ORDER BY n.lost_at, n.id",
        )
        .bind(ts(since))
        .fetch_all(&self.pool)
        .await?;
        for r in lost {
            events.push(event(&r, "node_lost", "id", "detail", "lost_at")?);
        }
        let unhealthy = sqlx::query(
            "SELECT n.owner_id, n.id, e.detail, e.at FROM events e JOIN nodes n ON n.id = e.node_id
             WHERE e.kind = 'node_unhealthy' AND e.at >= $1
               AND n.owner_id IN (SELECT owner_id FROM notification_hooks)
             ORDER BY e.at, e.id",
        )
        .bind(ts(since))
        .fetch_all(&self.pool)
        .await?;
        for r in unhealthy {
            events.push(event(&r, "node_unhealthy", "id", "detail", "at")?);
        }
        Ok(events)
    }
}
