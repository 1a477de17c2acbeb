//! Idle HTTP/1.1 connections to instances' ports, kept for the next request to the same port
//! of the same run of a reservation: a request through the proxy then costs no new tunnel
//! stream, no lookup on the agent and no TCP handshake inside the instance.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;

/// Idle connections kept per port of a run: as many as a busy client's concurrency.
const MAX_IDLE_PER_PORT: usize = 64;
/// How long an idle connection is kept: under the shortest keep-alive of common app servers
/// (gunicorn's 2 s), so that a request is not sent just as the app closes the connection (a
/// request it closed on after it was sent cannot be sent again: 502). Busy traffic reuses its
/// connections well within it.
const IDLE_FOR: Duration = Duration::from_secs(1);
/// How often the whole pool is swept of closed and stale connections.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// One port of one run of a reservation, on its node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub node: String,
    pub reservation_id: String,
    pub epoch: i64,
    pub port: u16,
}

#[derive(Debug)]
struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

impl Idle {
    /// Open and not kept too long (it may still be finishing its last answer).
    fn alive(&self) -> bool {
        self.since.elapsed() < IDLE_FOR && !self.sender.is_closed()
    }
}

#[derive(Debug)]
struct Pool {
    idle: HashMap<Key, Vec<Idle>>,
    swept: Instant,
}

/// This process's idle connections to instances.
#[derive(Debug)]
pub struct Upstreams {
    pool: Mutex<Pool>,
}

impl Default for Upstreams {
    fn default() -> Self {
        Upstreams {
            pool: Mutex::new(Pool {
                idle: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }
}

impl Upstreams {
    /// An idle connection to the key's port ready for a request, the most recently used first.
    /// One still finishing its last answer stays for a later request.
    pub(crate) fn take(&self, key: &Key) -> Option<SendRequest<Body>> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let list = pool.idle.get_mut(key)?;
        list.retain(Idle::alive);
        let ready = list.iter().rposition(|i| i.sender.is_ready());
        let taken = ready.map(|at| list.remove(at).sender);
        if list.is_empty() {
            pool.idle.remove(key);
        }
        taken
    }

    /// The answer's body, which gives its connection back once read to the end (one dropped
    /// half-read closes its connection instead).
    pub(crate) fn returning(
        self: &Arc<Self>,
        key: Key,
        sender: SendRequest<Body>,
        body: Incoming,
    ) -> Returning {
        Returning {
            body,
            back: Some((Arc::clone(self), key, sender)),
        }
    }

    fn put(&self, key: Key, sender: SendRequest<Body>) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.swept.elapsed() >= SWEEP_EVERY {
            pool.idle.retain(|_, list| {
                list.retain(Idle::alive);
                !list.is_empty()
            });
            pool.swept = Instant::now();
        }
        let list = pool.idle.entry(key).or_default();
        if list.len() < MAX_IDLE_PER_PORT {
            list.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    /// Idle connections kept now, all ports together.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.idle.values().map(Vec::len).sum()
    }
}

/// An app's answer on its way to the client: its connection goes back to the pool as its last
/// frame is read.
pub(crate) struct Returning {
    body: Incoming,
    back: Option<(Arc<Upstreams>, Key, SendRequest<Body>)>,
}

impl Returning {
    fn give_back(&mut self) {
        if let Some((upstreams, key, sender)) = self.back.take() {
            upstreams.put(key, sender);
        }
    }
}

/// An answer read to its end, its last frame never asked for again (no body at all, say),
/// still gives its connection back.
impl Drop for Returning {
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            self.give_back();
        }
    }
}

impl http_body::Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.body.is_end_stream() => self.give_back(),
            // A broken connection is not kept.
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;

    /// A loopback app that answers every request `ok` on kept-alive connections, counting
    /// the connections it accepts.
    async fn app() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Body::from("ok")))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    async fn dial(addr: std::net::SocketAddr) -> SendRequest<Body> {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        sender
    }

    fn key(epoch: i64) -> Key {
        Key {
            node: "n1".into(),
            reservation_id: "r1".into(),
            epoch,
            port: 8000,
        }
    }

    async fn get(sender: &mut SendRequest<Body>) -> hyper::Response<hyper::body::Incoming> {
        let request = hyper::Request::get("/").body(Body::empty()).unwrap();
        sender.send_request(request).await.unwrap()
    }

    #[tokio::test]
    async fn a_connection_is_kept_once_its_answer_is_read_and_only_for_its_run() {
        use http_body_util::BodyExt;
        let (addr, accepted) = app().await;
        let upstreams = Arc::new(Upstreams::default());
        let mut sender = dial(addr).await;
        let response = get(&mut sender).await;
        let body = upstreams.returning(key(1), sender, response.into_body());
        // Its answer is not read yet: nothing is idle.
        assert_eq!(upstreams.idle_count(), 0);
        let read = body.collect().await.unwrap().to_bytes();
        assert_eq!(&read[..], b"ok");
        assert_eq!(upstreams.idle_count(), 1);
        // Ready for the next request once its connection has taken in the end of the last.
        for _ in 0..100 {
            if upstreams.pool.lock().unwrap().idle[&key(1)][0]
                .sender
                .is_ready()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Another run of the reservation does not get it; its own does, once.
        assert!(upstreams.take(&key(2)).is_none());
        let mut again = upstreams.take(&key(1)).expect("the kept connection");
        assert!(upstreams.take(&key(1)).is_none());
        let _ = get(&mut again).await.into_body().collect().await.unwrap();
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_half_read_answer_closes_its_connection_which_is_not_kept() {
        let (addr, _) = app().await;
        let upstreams = Arc::new(Upstreams::default());
        let mut sender = dial(addr).await;
        let response = get(&mut sender).await;
        drop(upstreams.returning(key(1), sender, response.into_body()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(upstreams.take(&key(1)).is_none());
    }
}
