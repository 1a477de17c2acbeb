//! Templates in SQL: a user's own and the public ones.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::Template;
use sqlx::Row;

use super::{from_ts, new_id, ts, SqlStore};
use crate::{NewTemplate, Result, StoreError, TemplateStore};

const COLUMNS: &str = "t.id, t.name, t.image, t.command, t.env, t.http_ports, t.volume_mount,
    t.description, t.public, t.created_at, u.name AS owner
    FROM templates t LEFT JOIN users u ON u.id = t.owner_id";

/// Whose templates a viewer sees: their own, and the public ones.
const VISIBLE: &str = "(t.owner_id = $1 AND t.public = 0) OR t.public = 1";

fn from_row(row: &sqlx::any::AnyRow) -> Result<Template> {
    let json = |column: &str| -> Result<String> { Ok(row.try_get::<String, _>(column)?) };
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(format!("template: {e}"));
    Ok(Template {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        image: row.try_get("image")?,
        command: serde_json::from_str(&json("command")?).map_err(corrupt)?,
        env: serde_json::from_str(&json("env")?).map_err(corrupt)?,
        http_ports: serde_json::from_str(&json("http_ports")?).map_err(corrupt)?,
        volume_mount: row.try_get("volume_mount")?,
        description: row.try_get("description")?,
        public: row.try_get::<i64, _>("public")? != 0,
        owner: row.try_get("owner")?,
        created_at: from_ts(row.try_get("created_at")?)?,
    })
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(format!("template: {e}")))
}

#[async_trait]
impl TemplateStore for SqlStore {
    async fn create_template(&self, new: NewTemplate, now: DateTime<Utc>) -> Result<Template> {
        let id = new_id();
        let inserted = sqlx::query(
            "INSERT INTO templates (id, owner_id, name, image, command, env, http_ports,
                                    volume_mount, description, public, created_at)
             SELECT $1, u.id, $3, $4, $5, $6, $7, $8, $9, $10, $11 FROM users u WHERE u.id = $2",
        )
        .bind(&id)
        .bind(&new.owner_id)
        .bind(&new.name)
        .bind(&new.image)
        .bind(to_json(&new.command)?)
        .bind(to_json(&new.env)?)
        .bind(to_json(&new.http_ports)?)
        .bind(&new.volume_mount)
        .bind(&new.description)
        .bind(i64::from(new.public))
        .bind(ts(now))
        .execute(&self.pool)
        .await
        .map_err(StoreError::from)
        .map_err(|e| {
            if e.is_unique_violation() {
                StoreError::Duplicate(if new.public {
                    format!("name: there is a public template named {:?}", new.name)
                } else {
                    format!("name: you have a template named {:?}", new.name)
                })
            } else {
                e
            }
        })?
        .rows_affected();
        if inserted == 0 {
            return Err(StoreError::not_found("user", &new.owner_id));
        }
        self.template_by_id(&id).await
    }

    async fn list_templates(&self, viewer: &str) -> Result<Vec<Template>> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} WHERE {VISIBLE} ORDER BY t.name, t.public, t.id"
        ))
        .bind(viewer)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(from_row)
        .collect()
    }

    async fn template(&self, viewer: &str, name_or_id: &str) -> Result<Template> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} WHERE ({VISIBLE}) AND (t.name = $2 OR t.id = $2)
             ORDER BY t.public LIMIT 1"
        ))
        .bind(viewer)
        .bind(name_or_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("template", name_or_id))?;
        from_row(&row)
    }

    async fn remove_template(&self, id: &str) -> Result<()> {
        let removed = sqlx::query("DELETE FROM templates WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if removed == 0 {
            return Err(StoreError::not_found("template", id));
        }
        Ok(())
    }
}

impl SqlStore {
    async fn template_by_id(&self, id: &str) -> Result<Template> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} WHERE t.id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("template", id))?;
        from_row(&row)
    }
}
