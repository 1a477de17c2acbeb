//! Following a PostgreSQL failover and answering readiness: the hosts of a multi-host URL (or a
//! list of URLs), the one that takes writes picked at start and again when it is lost or turns
//! read-only, and whether the store can write now (checked at most once a second).

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, AnyPool, ConnectOptions, Connection};

use crate::{Result, StoreError};

/// How often the monitor checks the host the pool writes to.
const MONITOR_INTERVAL: Duration = Duration::from_secs(1);
/// How long one check (a connection and a query) may take before the host counts as lost.
const CHECK_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a readiness verdict is reused: a health check every second costs one query.
const READY_TTL: Duration = Duration::from_secs(1);
/// A monitor verdict older than this means the monitor is stuck (a host that does not answer).
const VERDICT_STALE: Duration = Duration::from_secs(5);

/// 1 when the session cannot write: a standby (`pg_is_in_recovery`) or a read-only default.
const READ_ONLY_SQL: &str = "SELECT CASE WHEN pg_is_in_recovery() \
     OR current_setting('transaction_read_only') = 'on' THEN 1 ELSE 0 END";

/// What `--database-url` names on PostgreSQL: one URL per host, and whether only a writable
/// host will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Targets {
    /// Single-host URLs, in the order given, without `target_session_attrs`.
    pub urls: Vec<String>,
    /// More than one host, or `target_session_attrs=read-write` on one: hosts are checked
    /// and followed.
    pub follow: bool,
}

/// Splits `postgres://u@h1:p1,h2:p2/db?target_session_attrs=read-write` (libpq's multi-host
/// form) or `postgres://u@h1/db,postgres://u@h2/db` (a list) into one URL per host. sqlx takes
/// one host only, so the store picks among them itself (`Failover`).
pub(crate) fn targets(url: &str) -> Result<Targets> {
    let bad = |why: &str| StoreError::UnsupportedUrl(format!("{} ({why})", redact(url)));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let urls: Vec<String> = if rest.contains(",postgres://") || rest.contains(",postgresql://") {
        url.split(',').map(str::to_owned).collect()
    } else {
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (format!("{user}@"), hosts),
            None => (String::new(), authority),
        };
        let hosts: Vec<&str> = hosts.split(',').collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(bad("a host is empty"));
        }
        hosts
            .into_iter()
            .map(|host| format!("{scheme}://{userinfo}{host}{tail}"))
            .collect()
    };
    let mut follow = urls.len() > 1;
    let mut clean = Vec::with_capacity(urls.len());
    for url in urls {
        let (base, query) = url.split_once('?').unwrap_or((url.as_str(), ""));
        if base.is_empty() || base.ends_with("://") {
            return Err(bad("a host is empty"));
        }
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("target_session_attrs", "read-write" | "primary")) => follow = true,
                Some(("target_session_attrs", other)) => {
                    return Err(bad(&format!(
                        "target_session_attrs={other} is not supported: the store writes, so \
                         only read-write (or primary) makes sense"
                    )))
                }
                _ => kept.push(pair),
            }
        }
        clean.push(if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        });
    }
    Ok(Targets {
        urls: clean,
        follow,
    })
}

/// `user:secret@` becomes `user:***@`, for messages and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((user, _)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:***@{}", &rest[user.len() + 1..])
        }
        _ => url.to_owned(),
    }
}

/// One host of a multi-host configuration.
#[derive(Debug)]
struct Host {
    /// `host:port`, for logs and messages (no credentials).
    label: String,
    options: AnyConnectOptions,
}

/// The hosts, the one the pool connects to now, and the monitor's last verdict.
#[derive(Debug)]
pub(crate) struct Failover {
    hosts: Vec<Host>,
    current: AtomicUsize,
    /// When the pool last moved to another host: older connections are dropped when taken.
    switched: Mutex<Instant>,
    /// Asks the monitor to check now (a new connection found its host read-only).
    nudge: tokio::sync::Notify,
    /// The monitor's last verdict on the current host and when it was reached.
    verdict: Mutex<(Instant, std::result::Result<(), String>)>,
}

impl Failover {
    /// The hosts of `targets`, each with the store's statement logging (`log`).
    pub(crate) fn new(
        targets: &Targets,
        log: impl Fn(AnyConnectOptions) -> AnyConnectOptions,
    ) -> Result<Self> {
        let mut hosts = Vec::with_capacity(targets.urls.len());
        for url in &targets.urls {
            let label = url
                .split_once("://")
                .map(|(_, rest)| rest)
                .map(|rest| &rest[..rest.find(['/', '?']).unwrap_or(rest.len())])
                .map(|auth| auth.rsplit_once('@').map_or(auth, |(_, host)| host))
                .unwrap_or(url)
                .to_owned();
            hosts.push(Host {
                label,
                options: log(AnyConnectOptions::from_str(
                    &super::session::with_settings(url),
                )?),
            });
        }
        Ok(Failover {
            hosts,
            current: AtomicUsize::new(0),
            switched: Mutex::new(Instant::now()),
            nudge: tokio::sync::Notify::new(),
            verdict: Mutex::new((Instant::now(), Err("not checked yet".to_owned()))),
        })
    }

    /// The first host, in the order given, that answers and takes writes; the pool's options.
    pub(crate) async fn pick_first(&self) -> Result<AnyConnectOptions> {
        let mut why = Vec::new();
        for (i, host) in self.hosts.iter().enumerate() {
            match check_host(&host.options).await {
                Ok(()) => {
                    self.current.store(i, Ordering::Relaxed);
                    self.record(Ok(()));
                    tracing::info!(host = %host.label, "database: writing to this host");
                    return Ok(host.options.clone());
                }
                Err(e) => why.push(format!("{}: {e}", host.label)),
            }
        }
        Err(StoreError::Unavailable(format!(
            "no database host takes writes ({})",
            why.join("; ")
        )))
    }

    /// The host the pool writes to now (`host:port`).
    pub(crate) fn current_host(&self) -> &str {
        &self.hosts[self.current.load(Ordering::Relaxed) % self.hosts.len()].label
    }

    /// Whether a pooled connection `age` old was opened before the last switch (it points at
    /// the old host, which may still answer, read-only).
    pub(crate) fn is_stale(&self, age: Duration) -> bool {
        let since = self
            .switched
            .lock()
            .map(|s| s.elapsed())
            .unwrap_or_default();
        age > since
    }

    /// Called when a new connection found its host read-only: check now, not at the next tick.
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    fn record(&self, verdict: std::result::Result<(), String>) {
        if let Ok(mut v) = self.verdict.lock() {
            *v = (Instant::now(), verdict);
        }
    }

    /// The monitor's last verdict, unless it is too old to trust.
    pub(crate) fn ready(&self) -> Result<()> {
        let (at, verdict) = self
            .verdict
            .lock()
            .map(|v| v.clone())
            .unwrap_or_else(|_| (Instant::now(), Err("monitor failed".to_owned())));
        if at.elapsed() > VERDICT_STALE {
            return Err(StoreError::Unavailable(format!(
                "the database check of {} has not finished for {}s",
                self.current_host(),
                at.elapsed().as_secs()
            )));
        }
        verdict.map_err(StoreError::Unavailable)
    }

    /// Checks the pool's host on the monitor's own connection (`own`: the host's index and
    /// the connection, opened when missing), never one of the pool's, which may all be busy
    /// under load or waiting on locks while the host is fine. When the host is lost or
    /// read-only, moves the pool to the first host (current one first) that takes writes.
    async fn tick(&self, pool: &AnyPool, own: &mut Option<(usize, AnyConnection)>) {
        let current = self.current.load(Ordering::Relaxed);
        if own.as_ref().is_some_and(|(host, _)| *host != current) {
            *own = None;
        }
        let checked = tokio::time::timeout(CHECK_TIMEOUT, async {
            if own.is_none() {
                let conn = self.hosts[current]
                    .options
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                *own = Some((current, conn));
            }
            match own.as_mut() {
                Some((_, conn)) => writable(conn).await,
                None => Err("no connection to check on".to_owned()),
            }
        })
        .await
        .unwrap_or_else(|_| Err("no answer within the check timeout".to_owned()));
        let Err(why) = checked else {
            self.record(Ok(()));
            return;
        };
        // The connection failed or is suspect: the next check opens another.
        *own = None;
        // The check's connection alone may have been lost (the host restarted and is back):
        // the host is asked again, first, on a fresh connection, before anything is moved.
        let order = std::iter::once(current).chain((0..self.hosts.len()).filter(|&i| i != current));
        let mut tried = Vec::new();
        for i in order {
            let host = &self.hosts[i];
            match check_host(&host.options).await {
                Ok(()) => {
                    if i != current {
                        pool.set_connect_options(host.options.clone());
                        // Stamped after the options changed: a connection opened in between
                        // is dropped needlessly, never one to the old host kept.
                        if let Ok(mut s) = self.switched.lock() {
                            *s = Instant::now();
                        }
                        self.current.store(i, Ordering::Relaxed);
                        tracing::warn!(from = %self.hosts[current].label, to = %host.label, pool_check = why, "database failover: now writing to another host");
                    }
                    self.record(Ok(()));
                    return;
                }
                Err(e) => {
                    if i == current {
                        tracing::warn!(host = %host.label, why = %e, "database host lost or read-only; looking for a writable one");
                    }
                    tried.push(format!("{}: {e}", host.label));
                }
            }
        }
        self.record(Err(format!(
            "no database host takes writes ({})",
            tried.join("; ")
        )));
    }
}

/// Connects to one host and asks whether it takes writes.
async fn check_host(options: &AnyConnectOptions) -> std::result::Result<(), String> {
    tokio::time::timeout(CHECK_TIMEOUT, async {
        let mut conn = options.connect().await.map_err(|e| e.to_string())?;
        let verdict = writable(&mut conn).await;
        let _ = conn.close().await;
        verdict
    })
    .await
    .unwrap_or_else(|_| Err("no answer within the check timeout".to_owned()))
}

/// Whether the session behind `conn` can write.
pub(crate) async fn writable(conn: &mut AnyConnection) -> std::result::Result<(), String> {
    let read_only: i32 = sqlx::query_scalar(READ_ONLY_SQL)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    if read_only == 0 {
        Ok(())
    } else {
        Err("the server is read-only (a standby, or transaction_read_only is on)".to_owned())
    }
}

/// The task that checks the pool's host every second and follows a failover; stopped when
/// the last store clone drops it.
#[derive(Debug)]
pub(crate) struct Monitor(tokio::task::JoinHandle<()>);

impl Monitor {
    pub(crate) fn start(failover: Arc<Failover>, pool: AnyPool) -> Self {
        Monitor(tokio::spawn(async move {
            let mut own = None;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(MONITOR_INTERVAL) => {}
                    () = failover.nudge.notified() => {}
                }
                if pool.is_closed() {
                    return;
                }
                failover.tick(&pool, &mut own).await;
            }
        }))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How the store answers readiness: SQLite's file, one PostgreSQL host (checked through the
/// pool, the verdict kept a second), or the monitor of several.
#[derive(Debug)]
pub(crate) enum Readiness {
    Sqlite {
        path: std::path::PathBuf,
    },
    Postgres,
    Follow {
        failover: Arc<Failover>,
        _monitor: Monitor,
    },
}

/// `Readiness` and its last verdict.
#[derive(Debug)]
pub(crate) struct Ready {
    pub kind: Readiness,
    last: tokio::sync::Mutex<Option<(Instant, std::result::Result<(), String>)>>,
}

impl Ready {
    pub(crate) fn new(kind: Readiness) -> Self {
        Ready {
            kind,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether the store can write now. Concurrent callers wait for one check and share it.
    pub(crate) async fn check(&self, pool: &AnyPool) -> Result<()> {
        if let Readiness::Follow { failover, .. } = &self.kind {
            return failover.ready();
        }
        let mut last = self.last.lock().await;
        if let Some((at, verdict)) = &*last {
            if at.elapsed() < READY_TTL {
                return verdict.clone().map_err(StoreError::Unavailable);
            }
        }
        let verdict = match &self.kind {
            Readiness::Sqlite { path } => sqlite_writable(pool, path).await,
            _ => tokio::time::timeout(CHECK_TIMEOUT, async {
                let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
                writable(&mut conn).await
            })
            .await
            .unwrap_or_else(|_| Err("no answer within the check timeout".to_owned())),
        };
        *last = Some((Instant::now(), verdict.clone()));
        verdict.map_err(StoreError::Unavailable)
    }
}

/// SQLite answers and its file can be opened for writing.
async fn sqlite_writable(
    pool: &AnyPool,
    path: &std::path::Path,
) -> std::result::Result<(), String> {
    sqlx::query("SELECT 1")
        .execute(pool)
        .await
        .map_err(|e| e.to_string())?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("{} is not writable: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_host_url_is_one_url_per_host() {
        let t = targets(
            "postgres://u:pw@h1:5432,h2:5433/db?sslmode=disable&target_session_attrs=read-write",
        )
        .expect("parse");
        assert_eq!(
            t.urls,
            vec![
                "postgres://u:pw@h1:5432/db?sslmode=disable",
                "postgres://u:pw@h2:5433/db?sslmode=disable"
            ]
        );
        assert!(t.follow);
    }

    #[test]
    fn a_list_of_urls_is_followed() {
        let t = targets("postgres://u@h1/db,postgresql://u@h2:6000/db").expect("parse");
        assert_eq!(
            t.urls,
            vec!["postgres://u@h1/db", "postgresql://u@h2:6000/db"]
        );
        assert!(t.follow);
    }

    #[test]
    fn one_host_is_followed_only_when_asked() {
        let plain = targets("postgres://u@h1:5432/db").expect("parse");
        assert_eq!(plain.urls, vec!["postgres://u@h1:5432/db"]);
        assert!(!plain.follow);
        let asked = targets("postgres://h1/db?target_session_attrs=primary").expect("parse");
        assert_eq!(asked.urls, vec!["postgres://h1/db"]);
        assert!(asked.follow);
    }

    #[test]
    fn other_session_attrs_and_empty_hosts_are_refused_without_the_password() {
        let e = targets("postgres://u:secret@h1,h2/db?target_session_attrs=standby")
            .expect_err("standby")
            .to_string();
        assert!(e.contains("target_session_attrs=standby"), "{e}");
        assert!(!e.contains("secret"), "{e}");
        let e = targets("postgres://u@h1,,h2/db")
            .expect_err("empty")
            .to_string();
        assert!(e.contains("a host is empty"), "{e}");
    }

    #[test]
    fn hosts_are_labelled_without_credentials() {
        let t = targets("postgres://u:pw@h1:1,h2:2/db").expect("parse");
        let f = Failover::new(&t, |o| o).expect("options");
        assert_eq!(f.current_host(), "h1:1");
        assert_eq!(f.hosts[1].label, "h2:2");
    }
}
