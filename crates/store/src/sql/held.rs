//! The reservation writer's own PostgreSQL connection, kept between its batches: its prepared
//! statements stay prepared (and planned once), and it pays no ping when it is given back to
//! the pool, as every pooled transaction does. It is opened outside the pool, on the writer's
//! thread (`combiner`), so that the replies to its round trips wake that thread directly.

use std::time::{Duration, Instant};

use sqlx::{AnyConnection, ConnectOptions, Connection, Executor};
use tokio::sync::{Mutex, MutexGuard};

use super::{begin_again, failover, SqlStore};
use crate::{Result, StoreError};

/// PostgreSQL plans a prepared statement again for each call while its generic plan looks
/// dearer than one made for the arguments, which the candidates' `LIMIT $4` makes it always
/// look: 0.94 ms of planning for 0.6 ms of running, every batch (`pg_stat_statements`,
/// 2026-12-03). The writer's statements are planned once instead; this connection never
/// returns to the pool, so the setting stays with it.
const GENERIC_PLANS: &str = "SET plan_cache_mode = force_generic_plan";

/// The connection, and when it was opened (a failover makes older ones stale).
type Slot = Option<(AnyConnection, Instant)>;

/// One connection for one writer at a time.
#[derive(Debug, Default)]
pub(super) struct Held {
    slot: Mutex<Slot>,
}

/// A transaction open on the held connection. Ended by `commit` or `rollback`; dropped
/// otherwise (an error, a cancelled task), it closes the connection, so that no later batch
/// runs inside what is left of this one.
pub(super) struct HeldTx<'a> {
    slot: MutexGuard<'a, Slot>,
    ended: bool,
}

impl Held {
    /// `BEGIN` on the held connection, or on a new one (`open`) when there is none yet or the
    /// last one failed or points at a host from before a failover. A connection lost
    /// meanwhile fails at `BEGIN`, before anything was sent: it is dropped and the next tried,
    /// as `SqlStore::begin` does.
    pub(super) async fn begin<'a>(&'a self, store: &SqlStore) -> Result<HeldTx<'a>> {
        let mut slot = self.slot.lock().await;
        if slot
            .as_ref()
            .is_some_and(|(_, since)| store.connection_is_stale(since.elapsed()))
        {
            *slot = None;
        }
        store.count_begun();
        let mut attempt = 1;
        loop {
            let began: Result<()> = async {
                if slot.is_none() {
                    *slot = Some((open(store).await?, Instant::now()));
                }
                if let Some((conn, _)) = slot.as_mut() {
                    conn.execute("BEGIN").await?;
                }
                Ok(())
            }
            .await;
            match began {
                Ok(()) => return Ok(HeldTx { slot, ended: false }),
                Err(e) => {
                    *slot = None;
                    if !begin_again(&e, attempt).await {
                        return Err(e);
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// Closes the connection (the store is closing).
    pub(super) async fn release(&self) {
        let conn = self.slot.lock().await.take();
        if let Some((conn, _)) = conn {
            // Its reads are driven by the writer's thread, which runs until the store is
            // dropped; a server that does not answer is not waited for long.
            let _ = tokio::time::timeout(CLOSE_WAIT, conn.close()).await;
        }
    }
}

/// How long opening the connection waits, as long as the pool waits for one of its own.
const OPEN_WAIT: Duration = Duration::from_secs(30);

/// How long closing the store waits for the server to acknowledge the connection's end.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A new connection to the host the pool connects to now, checked as the pool checks its own
/// (writable, where the store follows a failover), its statements planned once.
async fn open(store: &SqlStore) -> Result<AnyConnection> {
    let options = store.pool.connect_options();
    let mut conn = tokio::time::timeout(OPEN_WAIT, options.connect())
        .await
        .map_err(|_| {
            StoreError::Unavailable("the database did not accept a connection".to_owned())
        })??;
    if let failover::Readiness::Follow { failover, .. } = &store.ready.kind {
        if let Err(why) = failover::writable(&mut conn).await {
            failover.nudge();
            return Err(StoreError::from(sqlx::Error::Protocol(why)));
        }
    }
    conn.execute(GENERIC_PLANS).await?;
    Ok(conn)
}

impl HeldTx<'_> {
    /// The connection the transaction is open on.
    pub(super) fn conn(&mut self) -> Result<&mut AnyConnection> {
        match self.slot.as_mut() {
            Some((conn, _)) => Ok(conn),
            // `begin` returns only with a connection in the slot, and only `Drop` empties it.
            None => Err(StoreError::Unavailable(
                "the writer's database connection is gone".to_owned(),
            )),
        }
    }

    pub(super) async fn commit(mut self) -> Result<()> {
        self.end("COMMIT").await
    }

    pub(super) async fn rollback(mut self) -> Result<()> {
        self.end("ROLLBACK").await
    }

    async fn end(&mut self, statement: &str) -> Result<()> {
        self.conn()?.execute(statement).await?;
        self.ended = true;
        Ok(())
    }
}

impl Drop for HeldTx<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.slot.take();
        }
    }
}
