//! Sending deliveries: each due one claimed (so one replica sends it), POSTed as JSON to an
//! address its host resolved to and was checked for (`target.rs`), signed with HMAC-SHA256
//! of its webhook's secret, redirects never followed, and retried with back-off for a day.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpurent_store::{AttemptOutcome, DueDelivery};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{open_secret, target};
use crate::state::AppState;

/// Most deliveries sent at once.
const BATCH: u32 = 20;
/// How long a delivery is retried after it was queued.
pub(crate) const RETRY_FOR: chrono::Duration = chrono::Duration::hours(24);
/// The first retry's wait; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: chrono::Duration = chrono::Duration::seconds(30);
const MAX_BACKOFF: chrono::Duration = chrono::Duration::hours(1);
/// What an error answer's body may add to the attempt's record.
const ANSWER_EXCERPT: usize = 200;

/// The header that carries the signature: `sha256=` and the hex HMAC-SHA256 of the body.
pub(crate) const SIGNATURE_HEADER: &str = "x-gpurent-signature";

/// Whether a sending task runs (one at a time per replica), and whether a kick came since it
/// last looked for what is due.
#[derive(Debug, Default)]
pub struct NotifyState {
    sending: AtomicBool,
    wanted: AtomicBool,
}

/// `sha256=HEX` of `body` under `secret`.
pub(crate) fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        // HMAC takes a key of any length.
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// When attempt `attempt` (1 for the first) failed at `now`, what comes next: a retry after
/// 30 s doubled each time (at most an hour), while the delivery is under a day old.
pub(crate) fn after_failure(
    attempt: u32,
    now: DateTime<Utc>,
    created_at: DateTime<Utc>,
) -> AttemptOutcome {
    let doublings = attempt.saturating_sub(1).min(16);
    let wait = FIRST_BACKOFF
        .checked_mul(1 << doublings)
        .map_or(MAX_BACKOFF, |w| w.min(MAX_BACKOFF));
    let next = now + wait;
    if next > created_at + RETRY_FOR {
        AttemptOutcome::GiveUp
    } else {
        AttemptOutcome::Retry(next)
    }
}

/// Sends what is due, in a task of its own, so that a slow receiver never holds up the
/// maintenance loop. A task already sending is left to it, and looks again once done: a kick
/// that came after its last look (a retry that just fell due) is never lost.
pub(crate) fn kick(state: &AppState) {
    let notify = state.notify.clone();
    notify.wanted.store(true, Ordering::SeqCst);
    if notify.sending.swap(true, Ordering::SeqCst) {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        loop {
            notify.wanted.store(false, Ordering::SeqCst);
            if let Err(e) = send_due(&state).await {
                tracing::warn!(error = %e, "notifications: cannot read the deliveries due");
            }
            notify.sending.store(false, Ordering::SeqCst);
            // A kick that found this task sending left its work to it.
            if !notify.wanted.load(Ordering::SeqCst) || notify.sending.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
    });
}

/// Sends every delivery due now (a batch at a time, concurrently).
async fn send_due(state: &AppState) -> Result<(), gpurent_store::StoreError> {
    loop {
        let now = state.now();
        // Read deep enough that a webhook with many due does not hide the others.
        let due = state.store.due_deliveries(now, BATCH * 10).await?;
        if due.is_empty() {
            return Ok(());
        }
        let mut sent = 0;
        let mut tasks = tokio::task::JoinSet::new();
        // One at a time per webhook: a receiver that never answers holds up its own only.
        let mut hooks = std::collections::HashSet::new();
        let lease = now
            + chrono::Duration::from_std(state.config.notifications.timeout * 3)
                .unwrap_or(chrono::Duration::minutes(1));
        for d in due {
            if hooks.len() >= BATCH as usize || !hooks.insert(d.hook_id.clone()) {
                continue;
            }
            if !state.store.claim_delivery(&d.id, d.next_at, lease).await? {
                continue;
            }
            sent += 1;
            let state = state.clone();
            tasks.spawn(async move { attempt(&state, d).await });
        }
        while let Some(done) = tasks.join_next().await {
            if let Ok(Err(e)) = done {
                tracing::warn!(error = %e, "notifications: an attempt could not be recorded");
            }
        }
        if sent == 0 {
            return Ok(());
        }
    }
}

/// One attempt of `d`, recorded with its answer.
async fn attempt(state: &AppState, d: DueDelivery) -> Result<(), gpurent_store::StoreError> {
    let number = d.attempts + 1;
    let (status, error) = match post(state, &d).await {
        Ok((status, _)) if (200..300).contains(&status) => (Some(status), None),
        Ok((status, said)) => (Some(status), Some(status_error(status, said.as_deref()))),
        Err(why) => (None, Some(why)),
    };
    let now = state.now();
    let outcome = match &error {
        None => AttemptOutcome::Delivered,
        Some(_) => after_failure(number, now, d.created_at),
    };
    match (&outcome, &error) {
        (AttemptOutcome::Delivered, _) => {
            tracing::debug!(delivery = %d.id, kind = %d.kind, "notification delivered")
        }
        (_, Some(why)) => {
            tracing::info!(delivery = %d.id, kind = %d.kind, attempt = number, error = %why, ?outcome, "notification not delivered")
        }
        _ => {}
    }
    state
        .store
        .record_attempt(&d.id, number, now, status, error.as_deref(), outcome)
        .await
}

/// The system's trusted roots, read once.
fn roots() -> &'static [reqwest::Certificate] {
    static ROOTS: std::sync::OnceLock<Vec<reqwest::Certificate>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        rustls_native_certs::load_native_certs()
            .certs
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der.as_ref()).ok())
            .collect()
    })
}

fn status_error(status: u16, said: Option<&str>) -> String {
    match said {
        _ if (300..400).contains(&status) => {
            format!("answered {status}: redirects are not followed")
        }
        Some(said) => format!("answered {status}: {said}"),
        None => format!("answered {status}"),
    }
}

/// POSTs `d` and returns the status answered (with a line of what an error answer said), or
/// why there was none.
async fn post(state: &AppState, d: &DueDelivery) -> Result<(u16, Option<String>), String> {
    let secret = open_secret(state, &d.secret_sealed).map_err(|e| e.to_string())?;
    let url = target::parse(&d.url).map_err(|e| e.to_string())?;
    let config = &state.config.notifications;
    let addrs = target::resolve(&url, config.allow_private)
        .await
        .map_err(|e| e.to_string())?;
    let host = url.host_str().unwrap_or_default().to_owned();
    // Pinned to the addresses just checked (no proxy resolves it again); no redirect is
    // followed; https trusts the system's roots.
    let mut client = reqwest::Client::builder();
    for cert in roots() {
        client = client.add_root_certificate(cert.clone());
    }
    let client = client
        .timeout(config.timeout)
        .connect_timeout(config.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .resolve_to_addrs(&host, &addrs)
        .build()
        .map_err(|e| e.to_string())?;
    let body = d.payload.clone().into_bytes();
    let answer = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, signature(&secret, &body))
        .header("x-gpurent-event", &d.kind)
        .header("x-gpurent-delivery", &d.id)
        .body(body)
        .send()
        .await
        .map_err(|e| describe(&e.without_url(), config.timeout))?;
    let status = answer.status().as_u16();
    if (200..400).contains(&status) {
        return Ok((status, None));
    }
    // A line of what the receiver said, for the attempt's record: its first bytes only,
    // whatever it sends.
    let mut answer = answer;
    let mut head: Vec<u8> = Vec::new();
    while head.len() < ANSWER_EXCERPT {
        match answer.chunk().await {
            Ok(Some(chunk)) => head.extend_from_slice(&chunk),
            _ => break,
        }
    }
    head.truncate(ANSWER_EXCERPT);
    let text = String::from_utf8_lossy(&head);
    let excerpt: String = text.chars().take(ANSWER_EXCERPT).collect();
    let excerpt = excerpt.trim();
    Ok((status, (!excerpt.is_empty()).then(|| excerpt.to_owned())))
}

fn describe(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        format!("no answer within {} s", timeout.as_secs())
    } else if e.is_connect() {
        format!("could not connect: {e}")
    } else {
        e.to_string()
    }
}

/// Kept in `AppState`.
pub type SharedNotify = Arc<NotifyState>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::TimeZone;

    use super::*;

    #[test]
    fn signatures_are_the_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        let sig = signature(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn retries_back_off_and_stop_after_a_day() {
        let t0 = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
        assert_eq!(
            after_failure(1, t0, t0),
            AttemptOutcome::Retry(t0 + chrono::Duration::seconds(30))
        );
        assert_eq!(
            after_failure(3, t0, t0),
            AttemptOutcome::Retry(t0 + chrono::Duration::seconds(120))
        );
        assert_eq!(
            after_failure(40, t0, t0),
            AttemptOutcome::Retry(t0 + chrono::Duration::hours(1))
        );
        let late = t0 + chrono::Duration::hours(23) + chrono::Duration::minutes(30);
        assert_eq!(after_failure(30, late, t0), AttemptOutcome::GiveUp);
    }
}
