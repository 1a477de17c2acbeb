//! When a connection has been slow for too long: what it is doing (waiting for a first
//! request, idle between requests, sending a header, busy with requests), seen from its reads
//! and its requests, and the deadline that follows. A busy connection has none: a handler
//! that works long (an agent's long poll, `logs --follow`) is never cut.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Why a connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slow {
    /// No first request header in time, or one begun but not finished.
    Header,
    /// Kept alive with no new request.
    Idle,
}

#[derive(Debug)]
pub(super) struct Activity {
    header_timeout: Duration,
    idle_timeout: Duration,
    state: Mutex<State>,
    changed: Notify,
    /// Set while idle with no byte of a next request read: the read that brings one notes
    /// when the header began (cheap to check on every read).
    awaiting_bytes: AtomicBool,
}

#[derive(Debug)]
struct State {
    /// Requests begun whose response has not been sent in full.
    in_flight: usize,
    /// When the connection was accepted, or its last response was sent.
    since: Instant,
    /// No request yet: the first header is due `header_timeout` after the accept.
    first: bool,
    /// When the first byte of the next request came.
    header_began: Option<Instant>,
}

impl Activity {
    /// A connection accepted at `accepted`.
    pub(super) fn new(
        header_timeout: Duration,
        idle_timeout: Duration,
        accepted: Instant,
    ) -> Arc<Activity> {
        Arc::new(Activity {
            header_timeout,
            idle_timeout,
            state: Mutex::new(State {
                in_flight: 0,
                since: accepted,
                first: true,
                header_began: None,
            }),
            changed: Notify::new(),
            awaiting_bytes: AtomicBool::new(false),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When the connection is to be closed unless something happens first; `None` while a
    /// request is in flight.
    pub(super) fn deadline(&self) -> Option<(Instant, Slow)> {
        self.state()
            .deadline(self.header_timeout, self.idle_timeout)
    }

    /// Resolves when the deadline may have moved.
    pub(super) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// A request's header has been read: the connection is busy until the guard is dropped
    /// (with the response body, once sent, or with the request if it is abandoned).
    pub(super) fn begin_request(self: &Arc<Self>) -> RequestGuard {
        {
            let mut state = self.state();
            state.in_flight += 1;
            state.first = false;
            state.header_began = None;
        }
        self.awaiting_bytes.store(false, Ordering::Relaxed);
        self.changed.notify_one();
        RequestGuard(self.clone())
    }

    fn saw_bytes(&self) {
        if !self.awaiting_bytes.swap(false, Ordering::Relaxed) {
            return;
        }
        {
            let mut state = self.state();
            if state.in_flight == 0 && state.header_began.is_none() {
                state.header_began = Some(Instant::now());
            }
        }
        self.changed.notify_one();
    }
}

impl State {
    fn deadline(&self, header: Duration, idle: Duration) -> Option<(Instant, Slow)> {
        if self.in_flight > 0 {
            return None;
        }
        Some(match (self.first, self.header_began) {
            (true, _) => (self.since + header, Slow::Header),
            (false, Some(began)) => (began + header, Slow::Header),
            (false, None) => (self.since + idle, Slow::Idle),
        })
    }
}

/// Keeps its connection busy while alive.
#[derive(Debug)]
pub(super) struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let activity = &self.0;
        {
            let mut state = activity.state();
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0 {
                state.since = Instant::now();
                state.header_began = None;
                activity.awaiting_bytes.store(true, Ordering::Relaxed);
            }
        }
        activity.changed.notify_one();
    }
}

/// A connection's stream that tells its [`Activity`] when bytes come in.
#[derive(Debug)]
pub(super) struct Watched<IO> {
    inner: IO,
    activity: Arc<Activity>,
}

impl<IO> Watched<IO> {
    pub(super) fn new(inner: IO, activity: Arc<Activity>) -> Self {
        Watched { inner, activity }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.saw_bytes();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(30);

    #[test]
    fn deadlines_follow_what_the_connection_does() {
        let at = Instant::now();
        let later = at + Duration::from_secs(100);
        let state = |in_flight, first, header_began| State {
            in_flight,
            since: at,
            first,
            header_began,
        };
        // The first header is due after the accept, bytes or not.
        assert_eq!(
            state(0, true, None).deadline(HEADER, IDLE),
            Some((at + HEADER, Slow::Header))
        );
        // Busy: no deadline, however long the handler works.
        assert_eq!(state(1, false, None).deadline(HEADER, IDLE), None);
        assert_eq!(state(2, false, Some(later)).deadline(HEADER, IDLE), None);
        // Idle after a response, then a header begun.
        assert_eq!(
            state(0, false, None).deadline(HEADER, IDLE),
            Some((at + IDLE, Slow::Idle))
        );
        assert_eq!(
            state(0, false, Some(later)).deadline(HEADER, IDLE),
            Some((later + HEADER, Slow::Header))
        );
    }

    #[test]
    fn requests_and_reads_move_the_state() {
        let activity = Activity::new(HEADER, IDLE, Instant::now());
        assert!(matches!(activity.deadline(), Some((_, Slow::Header))));
        let first = activity.begin_request();
        let second = activity.begin_request();
        assert_eq!(activity.deadline(), None);
        // Bytes read while busy (a body) start no header.
        activity.saw_bytes();
        drop(first);
        assert_eq!(activity.deadline(), None, "one request still in flight");
        drop(second);
        let (idle_until, slow) = activity.deadline().expect("idle");
        assert_eq!(slow, Slow::Idle);
        activity.saw_bytes();
        let (header_until, slow) = activity.deadline().expect("header");
        assert_eq!(slow, Slow::Header);
        assert!(
            header_until < idle_until,
            "10 s from now is before 30 s from then"
        );
        // Later bytes of the same header do not move its deadline.
        activity.saw_bytes();
        assert_eq!(activity.deadline(), Some((header_until, Slow::Header)));
    }
}
