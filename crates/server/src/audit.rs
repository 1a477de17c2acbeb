//! The audit trail's writer: every API request, allowed or refused, becomes one record
//! (`gpurent-audit`), written before the request's answer goes out: in batches by one task, or
//! by the store in the transaction of a reservation it places at once (`AuditNote::within`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use chrono::{DateTime, Utc};
use gpurent_audit::{Entry, Signer};
use gpurent_store::{CheckpointPolicy, RecordWithin, Store, StoreError};
use gpurent_types::api::Reservation;
use gpurent_types::Clock;
use tokio::sync::{mpsc, oneshot};

use crate::state::AppState;

/// Records written in one transaction at most.
const BATCH: usize = 512;
/// Records waiting for the writer at most; a request waits for room beyond that.
const QUEUE: usize = 8192;
/// The longest a request waits for its record to be written before it is answered anyway.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// How the trail is kept.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// Off only for benchmarks that measure what the trail costs.
    pub enabled: bool,
    /// Signs the checkpoints (`--audit-key`, DATA_DIR/audit.key by default).
    pub signer: Arc<Signer>,
    pub checkpoints: CheckpointPolicy,
    /// Records older than this are pruned, in whole checkpointed segments (at least 365 days).
    pub retention: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            signer: Arc::new(Signer::from_seed(rand::random())),
            checkpoints: CheckpointPolicy::default(),
            retention: Duration::from_secs(365 * 24 * 3600),
        }
    }
}

type Pending = (Entry, oneshot::Sender<()>);

/// How often old records are looked for to prune.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// The sending side of the writer task.
#[derive(Debug, Clone)]
pub struct AuditTrail {
    queue: mpsc::Sender<Pending>,
    /// When pruning last ran.
    pruned_at: Arc<Mutex<Option<DateTime<Utc>>>>,
}

impl AuditTrail {
    /// Starts the writer task; it ends when every `AuditTrail` is dropped.
    pub fn start(store: Arc<dyn Store>, clock: Arc<dyn Clock>, config: &AuditConfig) -> Self {
        let (queue, pending) = mpsc::channel(QUEUE);
        tokio::spawn(write(
            store,
            clock,
            Arc::clone(&config.signer),
            config.checkpoints,
            pending,
        ));
        AuditTrail {
            queue,
            pruned_at: Arc::default(),
        }
    }

    /// Queues a record and waits until it is written (or the writer gives up on it).
    pub(crate) async fn record(&self, entry: Entry) {
        let (written, ack) = oneshot::channel();
        if self.queue.send((entry, written)).await.is_err() {
            tracing::error!("the audit writer has stopped; a record is lost");
            return;
        }
        if tokio::time::timeout(ACK_TIMEOUT, ack).await.is_err() {
            tracing::warn!(timeout = ?ACK_TIMEOUT, "an audit record is not written yet; answering anyway");
        }
    }
}

/// Removes the records past the retention, in whole checkpointed segments, once an hour (a
/// maintenance step).
pub(crate) async fn prune(state: &AppState, now: DateTime<Utc>) -> Result<(), StoreError> {
    let Some(trail) = &state.audit else {
        return Ok(());
    };
    {
        let mut last = trail
            .pruned_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let every = chrono::Duration::from_std(PRUNE_EVERY).unwrap_or(chrono::Duration::MAX);
        if last.is_some_and(|t| now < t + every) {
            return Ok(());
        }
        *last = Some(now);
    }
    let keep =
        chrono::Duration::from_std(state.config.audit.retention).unwrap_or(chrono::Duration::MAX);
    let before = now
        .checked_sub_signed(keep)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let pruned = state.store.prune_audit(before).await?;
    if pruned > 0 {
        tracing::info!(pruned, %before, "pruned audit records past their retention");
    }
    Ok(())
}

/// Writes what is queued in batches, one transaction each, and acknowledges each record.
async fn write(
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    signer: Arc<Signer>,
    policy: CheckpointPolicy,
    mut pending: mpsc::Receiver<Pending>,
) {
    let mut batch: Vec<Pending> = Vec::with_capacity(BATCH);
    while pending.recv_many(&mut batch, BATCH).await > 0 {
        let entries: Vec<Entry> = batch.iter().map(|(e, _)| e.clone()).collect();
        let mut backoff = Duration::from_millis(50);
        loop {
            match store
                .append_audit(&entries, &signer, policy, clock.now())
                .await
            {
                Ok(_) => break,
                Err(e) if backoff < Duration::from_secs(5) => {
                    tracing::warn!(error = %e, records = entries.len(), "cannot write audit records; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(e) => {
                    tracing::error!(error = %e, records = entries.len(), "audit records lost");
                    break;
                }
            }
        }
        for (_, ack) in batch.drain(..) {
            let _ = ack.send(());
        }
    }
}

/// What the request's handler learned for its record: who called, and which GPUs.
#[derive(Debug, Clone, Default)]
pub struct AuditNote(Arc<Mutex<Noted>>);

#[derive(Debug, Default)]
struct Noted {
    /// The record as begun before the handler (none on a detached note).
    begun: Option<Entry>,
    user_id: Option<String>,
    allocation: Option<String>,
    /// The store wrote the record with what the request changed: the middleware must not.
    recorded: bool,
}

impl AuditNote {
    fn with<R>(&self, f: impl FnOnce(&mut Noted) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The authenticated caller (a user id, or `node:<id>`).
    pub fn caller(&self, id: &str) {
        self.with(|n| n.user_id = Some(id.to_owned()));
    }

    /// The GPUs of the reservation the request was about.
    pub fn reservation(&self, r: &Reservation) {
        let allocation = gpurent_store::allocation_of(r);
        self.with(|n| n.allocation = Some(allocation));
    }

    /// The request's record for the store to write in its own transaction (its outcome and
    /// allocation are the store's to fill in); `None` where the trail is off.
    pub(crate) fn within(&self, state: &AppState) -> Option<RecordWithin> {
        state.audit.as_ref()?;
        let entry = self.with(|n| {
            let mut entry = n.begun.clone()?;
            entry.user_id.clone_from(&n.user_id);
            Some(entry)
        })?;
        Some(RecordWithin {
            entry,
            signer: Arc::clone(&state.config.audit.signer),
            policy: state.config.audit.checkpoints,
        })
    }

    /// The store wrote the request's record (`within`) with what it changed.
    pub(crate) fn recorded(&self) {
        self.with(|n| n.recorded = true);
    }
}

/// Tells the request's audit record who made it.
pub(crate) fn note_caller(extensions: &axum::http::Extensions, id: &str) {
    if let Some(note) = extensions.get::<AuditNote>() {
        note.caller(id);
    }
}

/// The request's note (a detached one where the trail is off).
impl<S: Send + Sync> FromRequestParts<S> for AuditNote {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<AuditNote>()
            .cloned()
            .unwrap_or_default())
    }
}

/// Requests that are not recorded: probes and documents anyone may read, the agents'
/// heartbeats that succeed (every 2 s per node; the node's state is kept by the store), and
/// calls of an endpoint's app (its traffic, counted in its figures), unless its key was
/// refused.
fn exempt(path: &str, method: &Method, status: u16) -> bool {
    matches!(
        path,
        "/healthz" | "/readyz" | "/metrics" | "/api/v1/openapi.json"
    ) || (method == Method::POST && path == "/api/v1/agent/sync" && status < 400)
        || (path.starts_with(crate::endpoints::serve::PREFIX) && !matches!(status, 401 | 403))
}

/// The middleware: notes the request, lets it run, and records what came of it before the
/// answer goes out, with the request id in `x-request-id`.
pub(crate) async fn record(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(trail) = state.audit.clone() else {
        return next.run(request).await;
    };
    let at = state.now();
    let request_id = format!("{:032x}", rand::random::<u128>());
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "(no route)".to_owned(), |m| m.as_str().to_owned());
    // A console page's reads are its page's record; a live refresh repeats a page's read,
    // and static files are no one's business.
    let quiet = (method == Method::GET
        && request
            .extensions()
            .get::<crate::console::api::Internal>()
            .is_some())
        || request.headers().contains_key(crate::console::LIVE_HEADER)
        || route == "/assets/{name}";
    if quiet {
        return next.run(request).await;
    }
    let client = request
        .extensions()
        .get::<ConnectInfo<crate::tls::Peer>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0.addr.to_string());
    let note = AuditNote(Arc::new(Mutex::new(Noted {
        begun: Some(Entry {
            request_id: request_id.clone(),
            at,
            user_id: None,
            action: format!("{method} {route}"),
            resource: path,
            allocation: None,
            // Until the handler answers.
            outcome: 0,
            client,
        }),
        ..Noted::default()
    })));
    let mut request = request;
    request.extensions_mut().insert(note.clone());
    let mut response = next.run(request).await;
    let status = response.status().as_u16();
    let noted = note.with(std::mem::take);
    if let (Some(begun), false) = (noted.begun, noted.recorded) {
        if !exempt(&route, &method, status) {
            trail
                .record(Entry {
                    user_id: noted.user_id,
                    allocation: noted.allocation,
                    outcome: status,
                    ..begun
                })
                .await;
        }
    }
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}
