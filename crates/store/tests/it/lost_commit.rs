//! A batch of reservations whose COMMIT reached the database but whose answer was lost (the
//! connection failed at that moment) is not placed again one by one: its outcome is unknown,
//! so each request is answered unavailable (503), and a retry with its Idempotency-Key finds
//! what was committed. Placing the batch's requests again would place a request without a key
//! twice and charge for both.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, SqlStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{one_gpu, reservations_of, t0, Fixture};

/// A loopback proxy to PostgreSQL that, once armed, forwards the next `COMMIT` and then drops
/// the connection instead of passing the database's answer back.
struct CommitCutter {
    url: String,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CommitCutter {
    async fn start(database_url: &str) -> CommitCutter {
        // postgres://user@host:port/db: the proxy takes host:port's place.
        let (scheme, rest) = database_url.split_once("://").expect("a URL");
        let (user, rest) = rest.split_once('@').expect("a user");
        let (upstream, db) = rest.split_once('/').expect("a database");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!(
            "{scheme}://{user}@{}/{db}",
            listener.local_addr().expect("address")
        );
        let (armed, cuts) = (Arc::<AtomicBool>::default(), Arc::<AtomicUsize>::default());
        let (a, c, upstream) = (armed.clone(), cuts.clone(), upstream.to_owned());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, a.clone(), c.clone()));
            }
        });
        CommitCutter {
            url,
            armed,
            cuts,
            task,
        }
    }
}

impl Drop for CommitCutter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
) {
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let mut cutting = false;
    loop {
        tokio::select! {
            n = client.read(&mut up) => {
                let Ok(n) = n else { return };
                if n == 0 || server.write_all(&up[..n]).await.is_err() {
                    return;
                }
                let commit = up[..n].windows(6).any(|w| w == b"COMMIT");
                if commit && armed.swap(false, Ordering::SeqCst) {
                    cutting = true;
                }
            }
            n = server.read(&mut down) => {
                let Ok(n) = n else { return };
                if n == 0 {
                    return;
                }
                if cutting {
                    // The database answered the COMMIT: it is applied. The client never hears.
                    cuts.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[tokio::test]
async fn a_batch_whose_commit_answer_was_lost_is_not_placed_again() {
    let f = Fixture::new(Backend::Postgres).await;
    let tenant = f.user("ann", "100").await;
    f.node("n1", "NVIDIA GeForce RTX 4090", 4).await;
    let proxy = CommitCutter::start(&f.url()).await;
    let store = SqlStore::connect(&proxy.url)
        .await
        .expect("connect through the proxy");
    let prices = PriceList::defaults();

    // Without a key: answered unavailable, committed once.
    proxy.armed.store(true, Ordering::SeqCst);
    let e = store
        .reserve(one_gpu(&tenant), &prices, t0(), t0(), &[])
        .await
        .expect_err("the answer was lost");
    assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1, "a COMMIT was cut");
    assert!(e.is_unavailable(), "answered 503: {e:?}");
    assert_eq!(
        reservations_of(&f, &tenant).await,
        1,
        "committed once and not placed again"
    );

    // With a key: the client's retry finds what was committed.
    proxy.armed.store(true, Ordering::SeqCst);
    let keyed = || {
        let mut new = one_gpu(&tenant);
        new.idempotency_key = Some("key-1".into());
        new
    };
    let e = store
        .reserve(keyed(), &prices, t0(), t0(), &[])
        .await
        .expect_err("the answer was lost");
    assert!(e.is_unavailable(), "{e:?}");
    assert_eq!(proxy.cuts.load(Ordering::SeqCst), 2);
    let (again, _) = store
        .reserve(keyed(), &prices, t0(), t0(), &[])
        .await
        .expect("the retry is answered");
    assert_eq!(reservations_of(&f, &tenant).await, 2, "one per request");
    let committed: String = {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&f.url())
            .await
            .expect("connect");
        sqlx::query_scalar("SELECT id FROM reservations WHERE idempotency_key = 'key-1'")
            .fetch_one(&mut conn)
            .await
            .expect("the keyed reservation")
    };
    assert_eq!(
        again.id, committed,
        "the retry is answered what was committed"
    );
    store.close().await;
}
