//! Serving an endpoint's URL: `NAME.e.APPS-DOMAIN` (the apps' site) and `/e/NAME/...` on the
//! control plane's own host (sandboxed, no cookies). A request is let in by one of the
//! endpoint's keys (or none, when it is public), waits for a ready replica up to the queue's
//! timeout, and goes to the one with the fewest requests in flight; a GET or HEAD that reached
//! no app is tried once more on another replica.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use super::live::{Live, Slot};
use crate::error::ApiError;
use crate::proxy::forward::{forward_hop, Hop, Unreached};
use crate::proxy::host::ViaHost;
use crate::state::AppState;

/// Where endpoints start on the control plane's own host.
pub const PREFIX: &str = "/e/";

/// How long a client is told to wait after a 503 or 429.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Set by `run_to_completion` on every request: resolves when its client went away (the
/// handler itself runs on to its end).
#[derive(Debug, Clone)]
pub(crate) struct Departed(pub tokio::sync::watch::Receiver<()>);

/// `NAME` and the app's path of `/e/NAME/...`; None when the path is not one.
pub(crate) fn parse(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix(PREFIX)?;
    let (name, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    (!name.is_empty()).then_some((name, tail))
}

/// The endpoint of this name: as this control plane knows it, or (made at another control plane
/// since its scaler last read) as the store has it.
async fn known(state: &AppState, name: &str) -> Option<Arc<Live>> {
    if let Some(live) = state.endpoints.get(name) {
        return Some(live);
    }
    let row = state.store.endpoint_by_name(name).await.ok()?;
    state.endpoints.put(row);
    state.endpoints.scaler.notify_one();
    state.endpoints.get(name)
}

/// A replica's request in flight: counted until its answer's body ends or is dropped.
struct InFlight {
    live: Arc<Live>,
    reservation_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.live.lock().give_back(&self.reservation_id);
        self.live.changed.notify_waiters();
    }
}

/// A request waiting in the queue: counted until it leaves it.
struct Waiting(Arc<Live>);

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.queued = inner.queued.saturating_sub(1);
    }
}

/// Every method, every path of an endpoint.
pub(crate) async fn handle(State(state): State<AppState>, request: Request) -> Response {
    let via_host = request.extensions().get::<ViaHost>().cloned();
    let full = request.uri().path().to_owned();
    let Some((name, tail)) = parse(&full) else {
        return ApiError::NoRoute(full.clone()).into_response();
    };
    let path = via_host.map_or_else(|| tail.to_owned(), |v| v.path);
    let Some(live) = known(&state, name).await else {
        return ApiError::NoRoute(full.clone()).into_response();
    };
    let apps_site = request.extensions().get::<ViaHost>().is_some();
    match serve(&state, &live, request, path, apps_site).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn serve(
    state: &AppState,
    live: &Arc<Live>,
    request: Request,
    path: String,
    apps_site: bool,
) -> Result<Response, ApiError> {
    let (endpoint_id, scaling, port, name) = {
        let inner = live.lock();
        (
            inner.row.id.clone(),
            inner.row.scaling.clone(),
            inner.row.spec.port,
            inner.row.name.clone(),
        )
    };
    if !scaling.public {
        let Ok(key) = crate::auth::bearer(request.headers()) else {
            return Err(ApiError::Unauthorized(format!(
                "endpoint {name} needs one of its keys: Authorization: Bearer gpe_... \
                 (gpurent endpoints keys create {name})"
            )));
        };
        let opens = state
            .store
            .endpoint_of_key(&crate::auth::hash_token(key))
            .await?;
        if opens.as_deref() != Some(endpoint_id.as_str()) {
            return Err(ApiError::Unauthorized(format!(
                "that key does not open endpoint {name}"
            )));
        }
    }
    let limit = u64::from(scaling.max_body_mb) * 1024 * 1024;
    let length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|n| n > limit) {
        live.lock().figures.rejected();
        return Err(ApiError::TooLarge {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
        });
    }
    let departed = request.extensions().get::<Departed>().cloned();
    let started = Instant::now();
    let retry = matches!(*request.method(), Method::GET | Method::HEAD).then(|| copy(&request));
    let slot = acquire(state, live, departed.clone(), None).await?;
    let waited = started.elapsed();
    let (mut response, mut slot) =
        attempt(state, live, slot, port, &path, apps_site, request).await;
    if let (Some(again), true) = (retry, response.extensions().get::<Unreached>().is_some()) {
        live.set_ready(&slot.reservation_id, false);
        let avoid = slot.reservation_id.clone();
        drop(slot);
        let next = acquire(state, live, departed, Some(&avoid)).await?;
        (response, slot) = attempt(state, live, next, port, &path, apps_site, again).await;
    }
    if response.extensions().get::<Unreached>().is_some() {
        live.lock().figures.rejected();
    } else {
        live.lock().figures.answered(waited, started.elapsed());
    }
    // The replica counts the request until its answer has been sent whole (a stream, an SSE).
    let (parts, body) = response.into_parts();
    let guarded = body.into_data_stream().map(move |chunk| {
        let _ = &slot;
        chunk
    });
    Ok(Response::from_parts(parts, Body::from_stream(guarded)))
}

/// Sends the request to one replica.
async fn attempt(
    state: &AppState,
    live: &Arc<Live>,
    slot: Slot,
    port: u16,
    path: &str,
    apps_site: bool,
    request: Request,
) -> (Response, InFlight) {
    let guard = InFlight {
        live: Arc::clone(live),
        reservation_id: slot.reservation_id.clone(),
    };
    let hop = Hop {
        reservation_id: &slot.reservation_id,
        node: &slot.node,
        epoch: slot.epoch,
        port,
        path: path.to_owned(),
        apps_site,
    };
    (forward_hop(state, &hop, request).await, guard)
}

/// A bodiless request again (a GET or HEAD to retry elsewhere).
fn copy(request: &Request) -> Request {
    let mut again = Request::new(Body::empty());
    *again.method_mut() = request.method().clone();
    *again.uri_mut() = request.uri().clone();
    *again.headers_mut() = request.headers().clone();
    if let Some(peer) = request
        .extensions()
        .get::<axum::extract::ConnectInfo<crate::tls::Peer>>()
    {
        again.extensions_mut().insert(peer.clone());
    }
    again
}

/// A replica for one request: at once when one is ready and under its cap, else after waiting
/// in the endpoint's queue (waking the scaler) until one is, the queue's timeout passes (503)
/// or the client goes away. 429 at once when the queue is full.
async fn acquire(
    state: &AppState,
    live: &Arc<Live>,
    mut departed: Option<Departed>,
    avoid: Option<&str>,
) -> Result<Slot, ApiError> {
    let (timeout, max_queue, target) = {
        let inner = live.lock();
        let s = &inner.row.scaling;
        (
            Duration::from_secs(s.queue_timeout_s),
            s.max_queue,
            s.target_inflight,
        )
    };
    // A replica is sent at most twice its target at once; beyond, requests wait for one.
    let cap = target.saturating_mul(2).max(1);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut waiting: Option<Waiting> = None;
    loop {
        let changed = live.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        {
            let mut inner = live.lock();
            if let Some(slot) = inner.take(cap, avoid) {
                return Ok(slot);
            }
            if let Some(refused) = refusal(&inner, state.now()) {
                inner.figures.rejected();
                return Err(refused);
            }
            if waiting.is_none() {
                if inner.queued >= max_queue {
                    inner.figures.rejected();
                    return Err(ApiError::QueueFull {
                        max: max_queue,
                        retry_after: RETRY_AFTER,
                    });
                }
                inner.queued += 1;
                waiting = Some(Waiting(Arc::clone(live)));
            }
        }
        state.endpoints.scaler.notify_one();
        let gone = async {
            match departed.as_mut() {
                Some(d) => {
                    let _ = d.0.changed().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut changed => {}
            () = tokio::time::sleep_until(deadline) => {
                let mut inner = live.lock();
                inner.figures.rejected();
                return Err(ApiError::EndpointUnavailable {
                    message: format!(
                        "no replica of endpoint {} was ready within {} s{}",
                        inner.row.name,
                        timeout.as_secs(),
                        starting_note(&inner)
                    ),
                    retry_after: RETRY_AFTER,
                });
            }
            () = gone => {
                return Err(ApiError::RequestTimeout(Duration::ZERO));
            }
        }
    }
}

/// What a request gets at once, with no replica ready: the endpoint is gone, its owner is out
/// of credit, or its replicas keep failing.
fn refusal(inner: &super::live::Inner, now: chrono::DateTime<chrono::Utc>) -> Option<ApiError> {
    use gpurent_types::api::EndpointState;
    let row = &inner.row;
    if inner.deleted {
        return Some(ApiError::EndpointUnavailable {
            message: format!("endpoint {} was deleted", row.name),
            retry_after: RETRY_AFTER,
        });
    }
    let waiting_out = row.retry_at.is_some_and(|at| at > now);
    match row.state {
        EndpointState::OutOfCredit if waiting_out => Some(ApiError::EndpointUnpaid(
            row.message
                .clone()
                .unwrap_or_else(|| format!("the owner of endpoint {} is out of credit", row.name)),
        )),
        EndpointState::Failing if row.failures >= super::scaler::MAX_FAILURES => {
            Some(ApiError::EndpointUnavailable {
                message: format!(
                    "endpoint {} stopped starting replicas after {} failures: {} \
                     (gpurent endpoints update {} starts it again)",
                    row.name,
                    row.failures,
                    row.message.as_deref().unwrap_or("they failed"),
                    row.name
                ),
                retry_after: RETRY_AFTER,
            })
        }
        _ => None,
    }
}

/// ` (N replicas starting)` or the latest failure, for a 503's message.
fn starting_note(inner: &super::live::Inner) -> String {
    let starting = inner.slots.iter().filter(|s| !s.ready).count();
    match (&inner.row.message, starting) {
        (Some(m), _) => format!(" ({m})"),
        (None, 0) => String::new(),
        (None, n) => format!(" ({n} starting)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_and_the_apps_path_are_read() {
        assert_eq!(parse("/e/llm/v1/chat"), Some(("llm", "/v1/chat")));
        assert_eq!(parse("/e/llm/"), Some(("llm", "/")));
        assert_eq!(parse("/e/llm"), Some(("llm", "/")));
        assert_eq!(parse("/e/"), None);
        assert_eq!(parse("/proxy/x/1/"), None);
    }
}
