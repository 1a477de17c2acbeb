//! A request body that must arrive in time: within the body timeout of its header, plus a
//! second for each KiB received (a slow but steady upload, such as an agent's logs on a thin
//! link, keeps going; a trickle does not). Past the deadline a read that would wait fails, and
//! the request is answered 408 (the handler sees a failed body read).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

/// Each byte received moves the deadline on by 1/this of a second.
const MIN_BYTES_PER_SEC: u64 = 1024;

/// The error a late body's read fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub(super) struct BodyTimedOut;

#[derive(Debug)]
pub(super) struct TimedBody {
    inner: Incoming,
    deadline: Instant,
    /// Made at the first read that has to wait: most bodies never need a timer.
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl TimedBody {
    pub(super) fn new(inner: Incoming, deadline: Instant, timed_out: Arc<AtomicBool>) -> Self {
        TimedBody {
            inner,
            deadline,
            sleep: None,
            timed_out,
        }
    }
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                let bytes = data.map_or(0, |d| d.len() as u64);
                // Bodies are capped (64 KiB, 4 MiB for agents): this earns at most hours.
                this.deadline = this
                    .deadline
                    .checked_add(earned(bytes))
                    .unwrap_or(this.deadline);
                if let Some(sleep) = this.sleep.as_mut() {
                    sleep.as_mut().reset(this.deadline);
                }
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.timed_out.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The time `bytes` received add to the deadline.
fn earned(bytes: u64) -> std::time::Duration {
    std::time::Duration::from_millis(bytes.saturating_mul(1000) / MIN_BYTES_PER_SEC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kib_received_earns_a_second() {
        assert_eq!(earned(0), std::time::Duration::ZERO);
        assert_eq!(earned(12), std::time::Duration::from_millis(11));
        assert_eq!(earned(64 * 1024), std::time::Duration::from_secs(64));
    }
}
