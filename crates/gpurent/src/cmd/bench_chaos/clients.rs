//! The chaos run's clients: tenants sending a steady mix of reserve, get, ls, logs and stop
//! through the load balancer at a fixed rate (a request is sent on time whether or not the
//! earlier ones were answered), with the CLI's own client and retries. Every try and every
//! request's outcome is kept for the report.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::api_client::{ApiClient, CliError, Retry, TryObserver};

/// What a request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Reserve,
    Get,
    Ls,
    Logs,
    Stop,
}

/// One request: when it was sent, how long until its final answer (retries included), and
/// whether it was answered (an API answer, not a failover's symptom after the last retry).
#[derive(Debug, Clone)]
pub struct Outcome {
    pub op: Op,
    pub sent: Instant,
    pub took: Duration,
    pub answered: bool,
    /// The error the client was left with, answered or not.
    pub error: Option<String>,
}

/// What the clients saw, shared by all their requests.
#[derive(Debug, Default)]
pub struct Record {
    pub outcomes: Mutex<Vec<Outcome>>,
    /// Every try: when it ended and whether it was answered.
    pub tries: Mutex<Vec<(Instant, bool)>>,
    /// Reservations whose creation was acknowledged (201).
    pub acknowledged: Mutex<Vec<String>>,
    /// Reservations whose stop was acknowledged.
    pub stopped: Mutex<Vec<String>>,
    /// Acknowledged reservations a GET answered 404 for.
    pub vanished: Mutex<BTreeSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Record {
    fn done(&self, op: Op, sent: Instant, result: &Result<(), CliError>) {
        let answered = match result {
            Ok(()) => true,
            // A failover's symptom that outlasted every retry, or the server's own failure, is
            // no answer; any other error is the API's answer (no capacity, not found, ...).
            Err(e) => {
                !matches!(
                    e.code.as_str(),
                    "unreachable"
                        | "unavailable"
                        | "internal"
                        | "bad_gateway"
                        | "http_error"
                        | "request_timeout"
                ) && !e.message.contains("still in progress")
            }
        };
        lock(&self.outcomes).push(Outcome {
            op,
            sent,
            took: sent.elapsed(),
            answered,
            error: result
                .as_ref()
                .err()
                .map(|e| format!("{op:?}: {} ({})", e.message, e.code)),
        });
    }
}

/// One tenant: its client and the reservations it holds (oldest first).
#[derive(Debug)]
pub struct Tenant {
    api: ApiClient,
    held: Mutex<Vec<String>>,
}

impl Tenant {
    pub fn new(base: &str, token: String, record: &Arc<Record>) -> Self {
        let tries = record.clone();
        let observer = TryObserver(Arc::new(move |failed: Option<&str>| {
            lock(&tries.tries).push((Instant::now(), failed.is_none()));
        }));
        Tenant {
            api: ApiClient::new(base, Some(token))
                .retry(Retry::DEFAULT)
                .observe(observer),
            held: Mutex::new(Vec::new()),
        }
    }
}

/// Sends `rate` requests a second, spread over the tenants in turn, until `stop`; then waits
/// for every request still out (its retries included).
pub async fn drive(
    tenants: Vec<Arc<Tenant>>,
    record: Arc<Record>,
    rate: f64,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.01)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = tokio::task::JoinSet::new();
    let mut i: usize = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let tenant = tenants[i % tenants.len()].clone();
        // Each tenant goes round the mix: reserve, get, ls, logs, stop.
        let op = [Op::Reserve, Op::Get, Op::Ls, Op::Logs, Op::Stop][(i / tenants.len()) % 5];
        i += 1;
        out.spawn(one(tenant, record.clone(), op));
        while out.try_join_next().is_some() {}
    }
    while out.join_next().await.is_some() {}
}

async fn one(tenant: Arc<Tenant>, record: Arc<Record>, op: Op) {
    let sent = Instant::now();
    let held = |newest: bool| {
        let held = lock(&tenant.held);
        if newest { held.last() } else { held.first() }.cloned()
    };
    let result = match op {
        Op::Reserve => {
            let key = uuid::Uuid::new_v4().to_string();
            let body = serde_json::json!({
                "gpu_type": "rtx4090",
                "hours": 1,
                "command": ["sleep", "infinity"],
            });
            tenant
                .api
                .post::<_, serde_json::Value>("/api/v1/reservations", &body, Some(&key))
                .await
                .map(|r| {
                    if let Some(id) = r["id"].as_str() {
                        lock(&record.acknowledged).push(id.to_owned());
                        lock(&tenant.held).push(id.to_owned());
                    }
                })
        }
        Op::Get => match held(true) {
            Some(id) => {
                let got = tenant
                    .api
                    .get::<serde_json::Value>(&format!("/api/v1/reservations/{id}"))
                    .await;
                if matches!(&got, Err(e) if e.code == "not_found") {
                    lock(&record.vanished).insert(id);
                }
                got.map(drop)
            }
            None => list(&tenant).await,
        },
        Op::Ls => list(&tenant).await,
        Op::Logs => match held(false) {
            Some(id) => tenant
                .api
                .get_bytes(
                    &format!("/api/v1/reservations/{id}/logs?offset=0"),
                    "x-log-next-offset",
                )
                .await
                .map(drop),
            None => list(&tenant).await,
        },
        Op::Stop => {
            // Hold two at most: the oldest beyond that is stopped.
            let oldest = {
                let held = lock(&tenant.held);
                (held.len() > 2).then(|| held[0].clone())
            };
            match oldest {
                Some(id) => {
                    lock(&tenant.held).retain(|h| h != &id);
                    let stopped = tenant
                        .api
                        .post_idempotent::<_, serde_json::Value>(
                            &format!("/api/v1/reservations/{id}/stop"),
                            &serde_json::json!({}),
                        )
                        .await;
                    if stopped.is_ok() {
                        lock(&record.stopped).push(id);
                    }
                    stopped.map(drop)
                }
                None => list(&tenant).await,
            }
        }
    };
    record.done(op, sent, &result);
}

async fn list(tenant: &Tenant) -> Result<(), CliError> {
    tenant
        .api
        .get::<Vec<serde_json::Value>>("/api/v1/reservations?limit=100")
        .await
        .map(drop)
}
