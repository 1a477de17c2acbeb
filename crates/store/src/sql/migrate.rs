//! Schema migrations: ordered SQL files compiled into the binary, each applied once in its own
//! transaction; on PostgreSQL an advisory lock keeps concurrent replicas from racing.

use sqlx::AnyPool;

use crate::{Backend, Result, StoreError};

const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "initial",
        include_str!("../../migrations/0001_initial.sql"),
    ),
    (
        2,
        "telemetry",
        include_str!("../../migrations/0002_telemetry.sql"),
    ),
    (3, "logs", include_str!("../../migrations/0003_logs.sql")),
    (4, "ports", include_str!("../../migrations/0004_ports.sql")),
    (
        5,
        "settlement",
        include_str!("../../migrations/0005_settlement.sql"),
    ),
    (6, "tiers", include_str!("../../migrations/0006_tiers.sql")),
    (
        7,
        "idempotency",
        include_str!("../../migrations/0007_idempotency.sql"),
    ),
    (
        8,
        "settlement_pages",
        include_str!("../../migrations/0008_settlement_pages.sql"),
    ),
    (
        9,
        "meter_previous",
        include_str!("../../migrations/0009_meter_previous.sql"),
    ),
    (10, "queue", include_str!("../../migrations/0010_queue.sql")),
    (
        11,
        "switch_groups",
        include_str!("../../migrations/0011_switch_groups.sql"),
    ),
    (
        12,
        "host_verification",
        include_str!("../../migrations/0012_host_verification.sql"),
    ),
    (
        13,
        "health_events",
        include_str!("../../migrations/0013_health_events.sql"),
    ),
    (
        14,
        "liveness",
        include_str!("../../migrations/0014_liveness.sql"),
    ),
    (
        15,
        "idle_reclaim",
        include_str!("../../migrations/0015_idle_reclaim.sql"),
    ),
    (
        16,
        "resume",
        include_str!("../../migrations/0016_resume.sql"),
    ),
    (17, "audit", include_str!("../../migrations/0017_audit.sql")),
    (
        18,
        "gpu_hours",
        include_str!("../../migrations/0018_gpu_hours.sql"),
    ),
    (
        19,
        "node_certs",
        include_str!("../../migrations/0019_node_certs.sql"),
    ),
    (20, "authz", include_str!("../../migrations/0020_authz.sql")),
    (
        21,
        "secrets",
        include_str!("../../migrations/0021_secrets.sql"),
    ),
    (
        22,
        "log_bytes",
        include_str!("../../migrations/0022_log_bytes.sql"),
    ),
    (
        23,
        "node_isolation",
        include_str!("../../migrations/0023_node_isolation.sql"),
    ),
    (
        24,
        "token_lineage",
        include_str!("../../migrations/0024_token_lineage.sql"),
    ),
    (
        25,
        "missing_gpus",
        include_str!("../../migrations/0025_missing_gpus.sql"),
    ),
    (
        26,
        "ssh_keys",
        include_str!("../../migrations/0026_ssh_keys.sql"),
    ),
    (
        27,
        "agent_tunnels",
        include_str!("../../migrations/0027_agent_tunnels.sql"),
    ),
    (
        28,
        "http_ports",
        include_str!("../../migrations/0028_http_ports.sql"),
    ),
    (
        29,
        "host_capacity_end_message",
        include_str!("../../migrations/0029_host_capacity_end_message.sql"),
    ),
    (
        30,
        "event_reservations",
        include_str!("../../migrations/0030_event_reservations.sql"),
    ),
    (
        31,
        "shared_keys",
        include_str!("../../migrations/0031_shared_keys.sql"),
    ),
    (
        32,
        "shared_network",
        include_str!("../../migrations/0032_shared_network.sql"),
    ),
    (
        33,
        "login_throttle",
        include_str!("../../migrations/0033_login_throttle.sql"),
    ),
    (
        34,
        "volumes",
        include_str!("../../migrations/0034_volumes.sql"),
    ),
    (
        35,
        "instance_disk",
        include_str!("../../migrations/0035_instance_disk.sql"),
    ),
    (
        36,
        "volume_billing",
        include_str!("../../migrations/0036_volume_billing.sql"),
    ),
    (
        37,
        "templates",
        include_str!("../../migrations/0037_templates.sql"),
    ),
    (
        38,
        "image_pulls",
        include_str!("../../migrations/0038_image_pulls.sql"),
    ),
    (
        39,
        "registries",
        include_str!("../../migrations/0039_registries.sql"),
    ),
    (
        40,
        "node_images",
        include_str!("../../migrations/0040_node_images.sql"),
    ),
    (41, "teams", include_str!("../../migrations/0041_teams.sql")),
    (
        42,
        "token_scopes",
        include_str!("../../migrations/0042_token_scopes.sql"),
    ),
    (
        43,
        "reservations_created_by",
        include_str!("../../migrations/0043_reservations_created_by.sql"),
    ),
    (
        44,
        "budgets",
        include_str!("../../migrations/0044_budgets.sql"),
    ),
    (
        45,
        "notifications",
        include_str!("../../migrations/0045_notifications.sql"),
    ),
    (
        46,
        "quotas",
        include_str!("../../migrations/0046_quotas.sql"),
    ),
    (
        47,
        "reservations_placed",
        include_str!("../../migrations/0047_reservations_placed.sql"),
    ),
    (
        48,
        "quota_use",
        include_str!("../../migrations/0048_quota_use.sql"),
    ),
    (
        49,
        "endpoints",
        include_str!("../../migrations/0049_endpoints.sql"),
    ),
    (
        50,
        "managed_jobs",
        include_str!("../../migrations/0050_managed_jobs.sql"),
    ),
    (
        51,
        "arrays",
        include_str!("../../migrations/0051_arrays.sql"),
    ),
];

/// The last migration this binary knows.
pub(crate) fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |&(version, _, _)| version)
}

/// A line `-- postgres only below` or `-- sqlite only below` in a migration starts a part that
/// runs on that database only (storage settings, or a table rebuild where SQLite cannot alter a
/// constraint), up to the next such line; `-- both below` goes back to what runs on both.
fn part_for(sql: &str, backend: Backend) -> String {
    let mut out = String::new();
    let mut applies = true;
    for line in sql.lines() {
        match line.trim() {
            "-- postgres only below" => applies = backend == Backend::Postgres,
            "-- sqlite only below" => applies = backend == Backend::Sqlite,
            "-- both below" => applies = true,
            _ if applies => {
                out.push_str(line);
                out.push('\n');
            }
            _ => {}
        }
    }
    out
}

/// An arbitrary constant naming gpurent's migration lock.
const PG_MIGRATION_LOCK: i64 = 0x0067_7075_7265_6e74;

pub(crate) async fn run(pool: &AnyPool, backend: Backend) -> Result<()> {
    // Under the lock too: PostgreSQL's CREATE TABLE IF NOT EXISTS is not safe against itself
    // (two replicas starting at once on a fresh database: one fails on pg_type's unique index).
    let mut tx = pool.begin().await?;
    if backend == Backend::Postgres {
        // Another replica's migration may hold the lock for longer than `lock_timeout`.
        sqlx::query("SET LOCAL lock_timeout = 0")
            .execute(&mut *tx)
            .await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PG_MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS gpurent_migrations (
            version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    for &(version, name, sql) in MIGRATIONS {
        let fail = |source| StoreError::Migration {
            version,
            name,
            source,
        };
        let mut tx = pool.begin().await?;
        if backend == Backend::Postgres {
            sqlx::query("SET LOCAL lock_timeout = 0")
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(PG_MIGRATION_LOCK)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
        }
        let applied: Option<i64> =
            sqlx::query_scalar("SELECT version FROM gpurent_migrations WHERE version = $1")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await
                .map_err(fail)?;
        if applied.is_some() {
            continue;
        }
        sqlx::raw_sql(&part_for(sql, backend))
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        sqlx::query(
            "INSERT INTO gpurent_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
        )
        .bind(version)
        .bind(name)
        .bind(chrono::Utc::now().timestamp_micros())
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
        tx.commit().await.map_err(fail)?;
        tracing::info!(version, name, "applied migration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last migration of the previous release (v0.1.0). During a rolling upgrade its
    /// replicas run on a database this release has migrated, and one restarted then runs its
    /// own migrations against it (it skips those it does not know): every migration after
    /// this one must keep the previous release's queries working. Raise it when a release is
    /// cut; a contraction (dropping what the previous release reads) lands one release after
    /// its expansion.
    const PREVIOUS_RELEASE_LATEST: i64 = 33;

    /// FNV-1a of the previous release's migrations, in order: a released migration never
    /// changes (a database that applied it would not get the change). Raise with
    /// `PREVIOUS_RELEASE_LATEST`.
    const PREVIOUS_RELEASE_MIGRATIONS_FNV: u64 = 0x1dd3_6a12_3ca4_9013;

    fn fnv1a(bytes: impl Iterator<Item = u8>) -> u64 {
        bytes.fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// What a migration may not do while the previous release still runs beside it: each
    /// drops, renames or narrows (a column's type, NOT NULL) something that release's queries
    /// use; SQLite's table rebuild is how it narrows a constraint.
    const CONTRACTIONS: &[&str] = &[
        "drop table",
        "drop column",
        "rename",
        "alter column",
        "drop constraint",
        "drop view",
        "truncate",
        "-- sqlite only below",
    ];

    fn contractions(sql: &str) -> Vec<&'static str> {
        let code: String = sql
            .lines()
            .map(|l| {
                // Our own directives are comments, but the table-rebuild one is a contraction.
                if l.trim() == "-- sqlite only below" {
                    l.trim().to_owned()
                } else {
                    l.split("--").next().unwrap_or_default().to_lowercase()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let code = code.split_whitespace().collect::<Vec<_>>().join(" ");
        CONTRACTIONS
            .iter()
            .copied()
            .filter(|c| code.contains(c))
            .collect()
    }

    #[test]
    fn migrations_after_the_previous_release_only_expand() {
        let offending: Vec<String> = MIGRATIONS
            .iter()
            .filter(|&&(version, _, _)| version > PREVIOUS_RELEASE_LATEST)
            .filter_map(|&(version, name, sql)| {
                let found = contractions(sql);
                (!found.is_empty()).then(|| format!("{version:04}_{name}: {found:?}"))
            })
            .collect();
        assert!(
            offending.is_empty(),
            "these would break the previous release's replicas mid-upgrade (expand now, \
             contract a release later): {offending:?}"
        );
        // The guard sees what it must.
        assert_eq!(
            contractions("ALTER TABLE t DROP COLUMN c; -- fine"),
            vec!["drop column"]
        );
        assert_eq!(
            contractions("ALTER TABLE t\n  RENAME   TO u;"),
            vec!["rename"]
        );
        assert!(contractions("ALTER TABLE t ADD COLUMN c TEXT; -- drop table later").is_empty());
        assert_eq!(
            contractions("A;\n-- sqlite only below\nCREATE TABLE t2 (x);"),
            vec!["-- sqlite only below"]
        );
    }

    #[test]
    fn the_previous_release_migrations_are_unchanged() {
        let released = MIGRATIONS
            .iter()
            .take_while(|&&(version, _, _)| version <= PREVIOUS_RELEASE_LATEST);
        assert_eq!(
            released.clone().last().map(|&(v, _, _)| v),
            Some(PREVIOUS_RELEASE_LATEST)
        );
        let fnv = fnv1a(released.flat_map(|&(_, name, sql)| name.bytes().chain(sql.bytes())));
        assert_eq!(
            fnv, PREVIOUS_RELEASE_MIGRATIONS_FNV,
            "a migration the previous release shipped has changed: add a new one instead"
        );
    }

    #[test]
    fn each_database_gets_the_shared_part_and_its_own() {
        let sql = "A;\n-- postgres only below\nP;\n-- sqlite only below\nS;\n-- both below\nB;\n";
        assert_eq!(part_for(sql, Backend::Postgres), "A;\nP;\nB;\n");
        assert_eq!(part_for(sql, Backend::Sqlite), "A;\nS;\nB;\n");
    }
}
