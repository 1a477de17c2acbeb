//! The SQL implementation of the store, over sqlx's `Any` driver: the same statements run on
//! SQLite and PostgreSQL (`$1` placeholders, BIGINT everywhere, `ON CONFLICT`).

mod access;
mod agent_events;
mod arrays;
mod audit;
mod batch;
mod batch_tenants;
mod batched;
mod budgets;
mod caps;
mod combiner;
mod create;
mod drain;
mod endings;
mod endpoints;
mod events;
mod failover;
mod fencing;
mod fleet;
mod fragments;
mod gpu_hours;
mod gpus;
mod health;
mod held;
mod idempotency;
mod ledger;
mod login_throttle;
mod logs;
mod metrics;
mod migrate;
mod node_images;
mod node_store;
mod nodes;
mod notifications;
mod placement;
mod proxy;
mod queue;
mod quota_use;
mod quotas;
mod read_cache;
mod registries;
mod reports;
mod reservations;
mod restarts;
mod rows;
mod samples;
mod seed;
mod session;
mod settlement;
mod shared_keys;
mod ssh_keys;
mod statements;
mod sync;
mod teams;
mod templates;
mod tunnels;
mod users;
mod volume_billing;
mod volume_mounts;
mod volume_nodes;
mod volumes;
mod wal;
mod writer_thread;

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyConnection, AnyPool, ConnectOptions, Executor};

pub use audit::CheckpointPolicy;
pub(crate) use health::health_json;
pub use settlement::Settled;

use crate::{Backend, Result, StoreError};

/// The last schema migration this binary knows (`backup` refuses a copy of a later one).
pub(crate) fn latest_migration() -> i64 {
    migrate::latest()
}

/// A GPU row's `switch_group`, as the placer's number.
pub(crate) fn switch_of(row: &sqlx::any::AnyRow) -> Result<Option<u32>> {
    use sqlx::Row;
    let group: Option<i64> = row.try_get("switch_group")?;
    Ok(group.and_then(|g| u32::try_from(g).ok()))
}

/// A store on SQLite or PostgreSQL.
#[derive(Debug, Clone)]
pub struct SqlStore {
    pool: AnyPool,
    backend: Backend,
    /// API tokens found valid lately (`read_cache`), shared by the store's clones.
    tokens: std::sync::Arc<read_cache::ReadCache<(crate::AuthUser, crate::TokenFacts)>>,
    /// Node credentials found valid lately: the node and its certificate (`read_cache`).
    node_credentials: std::sync::Arc<read_cache::ReadCache<(String, crate::NodeCertificate)>>,
    /// SQLite's WAL checkpoints, off the store's one connection (`wal`).
    checkpointer: Option<std::sync::Arc<wal::Checkpointer>>,
    /// Transactions begun (`begin`), for the tests and benchmarks that count them.
    begun: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Reservations waiting to be written together (`combiner`).
    combiner: std::sync::Arc<combiner::Combiner>,
    /// Whether the store can write now, and on PostgreSQL with several hosts the monitor that
    /// follows a failover (`failover`).
    ready: std::sync::Arc<failover::Ready>,
    /// The syncs' GPU samples not written yet, and the task that writes them (`gpu_hours`).
    gpu_hours: std::sync::Arc<gpu_hours::Pending>,
    _flusher: std::sync::Arc<gpu_hours::Flusher>,
    /// What each node's last written telemetry said (`samples`).
    samples: std::sync::Arc<samples::LatestSamples>,
}

impl SqlStore {
    /// Connects to `sqlite://PATH` (created when missing) or `postgres://...` and applies the
    /// migrations.
    pub async fn connect(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let (backend, url) = if let Some(path) = url.strip_prefix("sqlite://") {
            let sep = if path.contains('?') { '&' } else { '?' };
            (Backend::Sqlite, format!("sqlite://{path}{sep}mode=rwc"))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Backend::Postgres, url.to_owned())
        } else {
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        };
        // Every statement at trace level only (`RUST_LOG=sqlx::query=trace` shows them; the
        // tests count them), none as slow.
        let quiet = |options: AnyConnectOptions| {
            options
                .log_statements(tracing::log::LevelFilter::Trace)
                .log_slow_statements(tracing::log::LevelFilter::Off, Duration::MAX)
        };
        // PostgreSQL with several hosts (or `target_session_attrs=read-write`): the pool
        // connects to the one that takes writes, and a monitor moves it on a failover.
        let follow = match backend {
            Backend::Postgres => {
                let targets = failover::targets(&url)?;
                if targets.follow {
                    Some(std::sync::Arc::new(failover::Failover::new(
                        &targets, quiet,
                    )?))
                } else {
                    None
                }
            }
            Backend::Sqlite => None,
        };
        let options = match &follow {
            Some(failover) => failover.pick_first().await?,
            None => quiet(AnyConnectOptions::from_str(&match backend {
                Backend::Postgres => session::with_settings(&url),
                Backend::Sqlite => url.clone(),
            })?),
        };
        let pool = match backend {
            // One connection serialises writers, which SQLite does anyway; it avoids
            // SQLITE_BUSY between pooled connections and keeps transactions short.
            Backend::Sqlite => {
                AnyPoolOptions::new()
                    .max_connections(1)
                    .min_connections(1)
                    .acquire_timeout(Duration::from_secs(30))
                    // The connection is checked when it is returned, and an in-process
                    // database does not drop it meanwhile: a second check when it is taken
                    // would be one more round trip per transaction.
                    .test_before_acquire(false)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            for pragma in [
                                "PRAGMA journal_mode = WAL",
                                "PRAGMA synchronous = NORMAL",
                                "PRAGMA foreign_keys = ON",
                                "PRAGMA busy_timeout = 10000",
                                wal::NO_AUTOCHECKPOINT,
                            ] {
                                conn.execute(pragma).await?;
                            }
                            Ok(())
                        })
                    })
                    .connect_with(options.clone())
                    .await?
            }
            Backend::Postgres => {
                let pool = AnyPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(30))
                    // sqlx pings a connection when it is given back; when it is taken, only
                    // one that sat idle a while is pinged again (`fresh_enough`), not one of a
                    // busy pool: a round trip on every statement (a heartbeat's statement was
                    // three: the two pings and itself).
                    .test_before_acquire(false);
                match &follow {
                    None => {
                        pool.before_acquire(|conn, meta| {
                            Box::pin(async move { Ok(fresh_enough(conn, meta.idle_for).await) })
                        })
                        .connect_with(options.clone())
                        .await?
                    }
                    Some(failover) => {
                        let (on_connect, on_acquire) = (failover.clone(), failover.clone());
                        pool
                            // A new connection to a host that turned read-only is refused
                            // (the pool tries again, by then on the monitor's new host).
                            .after_connect(move |conn, _| {
                                let failover = on_connect.clone();
                                Box::pin(async move {
                                    match failover::writable(conn).await {
                                        Ok(()) => Ok(()),
                                        Err(why) => {
                                            failover.nudge();
                                            Err(sqlx::Error::Protocol(why))
                                        }
                                    }
                                })
                            })
                            // One opened before the last switch points at the old host.
                            .before_acquire(move |conn, meta| {
                                let stale = on_acquire.is_stale(meta.age);
                                Box::pin(async move {
                                    Ok(!stale && fresh_enough(conn, meta.idle_for).await)
                                })
                            })
                            .connect_with(options.clone())
                            .await?
                    }
                }
            }
        };
        let readiness = match (&follow, backend) {
            (Some(failover), _) => failover::Readiness::Follow {
                failover: failover.clone(),
                _monitor: failover::Monitor::start(failover.clone(), pool.clone()),
            },
            (None, Backend::Postgres) => failover::Readiness::Postgres,
            (None, Backend::Sqlite) => failover::Readiness::Sqlite {
                path: std::path::PathBuf::from(
                    url.trim_start_matches("sqlite://")
                        .split('?')
                        .next()
                        .unwrap_or_default(),
                ),
            },
        };
        let pending = std::sync::Arc::new(gpu_hours::Pending::default());
        let store = SqlStore {
            _flusher: std::sync::Arc::new(gpu_hours::Flusher::start(
                pool.clone(),
                backend,
                pending.clone(),
            )),
            gpu_hours: pending,
            samples: Default::default(),
            pool,
            backend,
            tokens: std::sync::Arc::new(read_cache::ReadCache::new(read_cache::TOKEN_TTL)),
            node_credentials: std::sync::Arc::new(read_cache::ReadCache::new(read_cache::NODE_TTL)),
            checkpointer: None,
            begun: Default::default(),
            combiner: Default::default(),
            ready: std::sync::Arc::new(failover::Ready::new(readiness)),
        };
        migrate::run(&store.pool, backend).await?;
        let checkpointer = match backend {
            Backend::Sqlite => Some(std::sync::Arc::new(wal::start(&options).await?)),
            Backend::Postgres => None,
        };
        Ok(SqlStore {
            checkpointer,
            ..store
        })
    }

    /// Brings the planner's statistics up to date on PostgreSQL (`ANALYZE`), as autovacuum does
    /// within a minute of a burst of writes; nothing on SQLite, whose plans need none. The
    /// benchmarks run it after their warm-up, so that they measure a database in service:
    /// plans made while a table was empty (a foreign key's check, the Idempotency-Keys' read)
    /// scan it whole as it grows, until its statistics are gathered again.
    pub async fn refresh_statistics(&self) -> Result<()> {
        if self.backend == Backend::Postgres {
            self.pool.execute("ANALYZE").await?;
        }
        Ok(())
    }

    /// Whether the store can write now: SQLite's file is writable, PostgreSQL answers and is
    /// neither a standby nor read-only. Checked at most once a second (health checks ask often).
    pub async fn ready(&self) -> Result<()> {
        self.ready.check(&self.pool).await
    }

    /// A transaction. On SQLite it takes the write lock at once (`BEGIN IMMEDIATE`), waiting
    /// for it under the busy timeout: a deferred transaction that reads and then writes fails
    /// outright when another process (a second replica or tool) wrote in between.
    pub(crate) async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>> {
        self.count_begun();
        // A connection lost between transactions (a failover, a restart) fails here before
        // anything was sent: trying again, on the connection the pool opens next (by then on
        // the new host), doubles nothing.
        let mut attempt = 1;
        loop {
            match begin_on(&self.pool, self.backend).await {
                Ok(tx) => return Ok(tx),
                Err(e) => {
                    let e = StoreError::from(e);
                    if self.backend == Backend::Sqlite || !begin_again(&e, attempt).await {
                        return Err(e);
                    }
                    attempt += 1;
                }
            }
        }
    }

    fn count_begun(&self) {
        self.begun
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a connection taken from the pool `age` ago points at a host from before the
    /// last failover (`failover`); never without one.
    fn connection_is_stale(&self, age: Duration) -> bool {
        match &self.ready.kind {
            failover::Readiness::Follow { failover, .. } => failover.is_stale(age),
            _ => false,
        }
    }

    /// The PostgreSQL host (`host:port`) the store writes to now, where it follows a failover
    /// among several; `None` otherwise.
    pub fn database_host(&self) -> Option<String> {
        match &self.ready.kind {
            failover::Readiness::Follow { failover, .. } => {
                Some(failover.current_host().to_owned())
            }
            _ => None,
        }
    }

    /// How many transactions this store has begun: what a path costs in the write lock
    /// (SQLite's `BEGIN IMMEDIATE`) and in round trips.
    pub fn transactions_begun(&self) -> u64 {
        self.begun.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes the GPU samples added up in memory (`gpu_hours`): before a report reads them, and
    /// at close.
    pub(crate) async fn flush_gpu_hours(&self) -> Result<()> {
        gpu_hours::flush(&self.pool, self.backend, &self.gpu_hours).await
    }

    /// Writes what is kept in memory, then closes the pool, waiting for connections in use.
    pub async fn close(&self) {
        if let Err(e) = self.flush_gpu_hours().await {
            tracing::warn!(error = %e, "closing: cannot write the GPU-hour rollup");
        }
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.stop().await;
        }
        self.combiner.release().await;
        self.pool.close().await;
    }
}

/// One `BEGIN` on `pool`: on SQLite `BEGIN IMMEDIATE`, the write lock at once (`SqlStore::begin`
/// says why), for the store and for tasks that hold only its pool.
pub(crate) async fn begin_on(
    pool: &AnyPool,
    backend: Backend,
) -> std::result::Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
    match backend {
        Backend::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await,
        Backend::Postgres => pool.begin().await,
    }
}

/// Times are stored as unix microseconds, UTC.
pub(crate) fn ts(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub(crate) fn from_ts(micros: i64) -> Result<DateTime<Utc>> {
    Utc.timestamp_micros(micros)
        .single()
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {micros} out of range")))
}

/// A new row's id: time-ordered (UUIDv7), so that rows written together land in the same
/// pages of their primary key and indexes instead of one random page each (what a commit
/// writes to the log).
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// MiB to the nearest GiB, as GPU memory is advertised (24564 MiB is a 24 GB card).
pub(crate) fn gib(mb: i64) -> u32 {
    u32::try_from((mb + 512) / 1024).unwrap_or(u32::MAX)
}

/// How often `begin` tries when the connection is lost before the transaction started.
const BEGIN_ATTEMPTS: u32 = 5;

/// After try `attempt` at `BEGIN` failed with `e`: whether to try again (on another
/// connection), after the failover backoff. Only a lost connection is, since nothing was sent.
pub(super) async fn begin_again(e: &StoreError, attempt: u32) -> bool {
    if !e.is_unavailable() || attempt >= BEGIN_ATTEMPTS {
        return false;
    }
    tracing::debug!(attempt, error = ?e, "database connection lost at BEGIN; trying again");
    tokio::time::sleep(FAILOVER_BACKOFF * attempt).await;
    true
}

/// A pooled PostgreSQL connection idle this long is pinged before it is used: the server may
/// have ended it meanwhile (a restart, a failover), and a dead one is then replaced instead of
/// failing a request. One busier than that was answered by the server moments ago.
const PING_IF_IDLE: Duration = Duration::from_secs(1);

/// Whether a connection taken from the pool after `idle` may be used as it is (see
/// [`PING_IF_IDLE`]).
async fn fresh_enough(conn: &mut sqlx::AnyConnection, idle: Duration) -> bool {
    idle < PING_IF_IDLE || sqlx::Connection::ping(conn).await.is_ok()
}
/// The wait before another try after a failover-class error, times the attempt: 0.25 s up to
/// 1 s, about as long as the failover monitor takes to find the new host.
const FAILOVER_BACKOFF: Duration = Duration::from_millis(250);

/// Runs a transaction again when the database aborted it to break a deadlock or a
/// serialization conflict or a lock wait past `lock_timeout` (`session`; once), or refused its
/// first write as read-only (the host was demoted;
/// the monitor moves the pool meanwhile); such an abort leaves nothing behind. A connection
/// lost during the transaction is not retried here: its COMMIT may have been applied with the
/// answer lost, so the error goes back to the client (503), whose retry with the same
/// `Idempotency-Key` finds what was committed instead of doing it twice.
pub(crate) async fn retry_transient<T, F, Fut>(what: &'static str, run: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    retry(what, ThroughFailover::Yes, run).await
}

/// Runs `run` again on a deadlock or serialization failure only: for work that must not wait
/// through a failover, such as fencing, whose caller tries again once the store has answered
/// for a while.
pub(crate) async fn retry_conflicts<T, F, Fut>(what: &'static str, run: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    retry(what, ThroughFailover::No, run).await
}

/// Whether a write refused as read-only is tried again after a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ThroughFailover {
    Yes,
    No,
}

async fn retry<T, F, Fut>(what: &'static str, failover: ThroughFailover, mut run: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    const ATTEMPTS: u32 = 5;
    // A lock wait past `lock_timeout` already took seconds: one more try, not five.
    const LOCK_WAITS: u32 = 2;
    let (mut attempt, mut lock_waits) = (1, 0);
    loop {
        match run().await {
            Err(e) if e.is_lock_timeout() => {
                lock_waits += 1;
                if lock_waits >= LOCK_WAITS || attempt >= ATTEMPTS {
                    return Err(e);
                }
                tracing::warn!(what, error = ?e, "a lock wait timed out; trying once more");
                attempt += 1;
            }
            Err(e) if e.is_transient() && attempt < ATTEMPTS => {
                tracing::debug!(what, attempt, error = ?e, "transient database conflict; retrying");
                attempt += 1;
            }
            Err(e)
                if failover == ThroughFailover::Yes && e.is_read_only() && attempt < ATTEMPTS =>
            {
                tracing::debug!(what, attempt, error = ?e, "database turned read-only; retrying");
                tokio::time::sleep(FAILOVER_BACKOFF * attempt).await;
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// Rows per multi-row statement (SQLite allows 32,766 parameters, PostgreSQL 65,535).
pub(super) const ROWS_PER_STATEMENT: usize = 500;

/// Runs `head`, then `(…), (…)` rows of `width` parameters each, then `tail`, in chunks small
/// enough for either database's parameter limit; returns the rows affected.
pub(crate) async fn multi_row<F>(
    conn: &mut AnyConnection,
    rows: usize,
    width: usize,
    head: &str,
    tail: &str,
    mut bind: F,
) -> Result<u64>
where
    F: for<'q> FnMut(
        usize,
        sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
{
    let mut affected = 0;
    let mut start = 0;
    while start < rows {
        let end = (start + ROWS_PER_STATEMENT).min(rows);
        let mut sql = String::from(head);
        for (n, _) in (start..end).enumerate() {
            sql.push_str(if n == 0 { "(" } else { ", (" });
            for c in 0..width {
                if c > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("${}", n * width + c + 1));
            }
            sql.push(')');
        }
        sql.push_str(tail);
        let mut query = sqlx::query(&sql);
        for i in start..end {
            query = bind(i, query);
        }
        affected += query.execute(&mut *conn).await?.rows_affected();
        start = end;
    }
    Ok(affected)
}

/// A page of a user's rows (every user's for `$1 = ''`) of `table`, newest first, after the
/// row `$2` (none for `''`), at most `$3`: keyset pagination on `(created_at, id)`. The cursor
/// is looked up among the same user's rows, so another user's id answers an empty page, as an
/// unknown one. `select_from` is `"COLUMNS FROM table"`.
pub(crate) fn users_page_sql(select_from: &str, table: &str) -> String {
    format!(
        "SELECT {select_from} WHERE ($1 = '' OR user_id = $1)
           AND ($2 = '' OR (created_at, id) < (SELECT c.created_at, c.id FROM {table} c
                                               WHERE c.id = $2
                                                 AND ($1 = '' OR c.user_id = $1)))
         ORDER BY created_at DESC, id DESC LIMIT $3"
    )
}
