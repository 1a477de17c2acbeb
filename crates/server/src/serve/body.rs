//! A request body that must arrive in time: past its deadline, a read that would wait fails,
//! and the request is answered 408 (the handler sees a failed body read).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

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
