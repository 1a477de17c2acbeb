//! The reservation writer's own PostgreSQL connection, kept between its batches: its prepared
//! statements stay prepared (and planned once), and it pays no ping when it is given back to
//! the pool, as every pooled transaction does.

use std::time::Instant;

use sqlx::any::Any;
use sqlx::pool::PoolConnection;
use sqlx::{AnyConnection, Executor};
use tokio::sync::{Mutex, MutexGuard};

use super::{begin_again, SqlStore};
use crate::{Result, StoreError};

/// The connection, and when it was taken from the pool (a failover makes older ones stale).
type Slot = Option<(PoolConnection<Any>, Instant)>;

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
    /// `BEGIN` on the held connection, or on one taken from the pool when there is none yet
    /// or the last one failed or points at a host from before a failover. A connection lost
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
            if slot.is_none() {
                let mut conn = store.pool.acquire().await?;
                // Never back to the pool: a connection dropped mid-transaction is closed.
                conn.close_on_drop();
                *slot = Some((conn, Instant::now()));
            }
            let began = match slot.as_mut() {
                Some((conn, _)) => conn.execute("BEGIN").await.map(|_| ()),
                None => Ok(()),
            };
            match began {
                Ok(()) => return Ok(HeldTx { slot, ended: false }),
                Err(e) => {
                    *slot = None;
                    let e = StoreError::from(e);
                    if !begin_again(&e, attempt).await {
                        return Err(e);
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// Closes the connection (the store is closing: its pool waits for every connection).
    pub(super) async fn release(&self) {
        self.slot.lock().await.take();
    }
}

impl HeldTx<'_> {
    /// The connection the transaction is open on.
    pub(super) fn conn(&mut self) -> Result<&mut AnyConnection> {
        match self.slot.as_mut() {
            Some((conn, _)) => Ok(&mut **conn),
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
