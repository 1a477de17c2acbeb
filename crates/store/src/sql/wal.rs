//! SQLite's WAL checkpoints on a connection of their own, so that the one connection every
//! transaction waits for never stops to copy the log into the database file.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::any::AnyConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Result;

/// How often the log is copied into the database. At a few thousand commits a second the
/// log grows by tens of MiB in between, most of it the same hot pages again, copied once.
const EVERY: Duration = Duration::from_millis(200);

/// The checkpointing task; it stops when the last store handle drops this, or at
/// [`Checkpointer::stop`].
#[derive(Debug)]
pub(crate) struct Checkpointer {
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    /// Tells the task to stop (once; later calls do nothing).
    fn signal(&self) {
        let stop = self
            .stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(stop) = stop {
            let _ = stop.send(());
        }
    }

    /// Stops the task and waits until its connection is closed.
    pub(crate) async fn stop(&self) {
        self.signal();
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.signal();
    }
}

/// The statement the store's own connection runs at connect: no automatic checkpoints, which
/// SQLite would otherwise run in whichever commit crosses 1,000 pages of log, holding every
/// other transaction up (with an fsync) meanwhile.
pub(crate) const NO_AUTOCHECKPOINT: &str = "PRAGMA wal_autocheckpoint = 0";

/// Opens a second connection to the database of `options` and checkpoints on it every
/// [`EVERY`], passively: frames a reader still needs are left for the next time, and writers
/// go on meanwhile.
pub(crate) async fn start(options: &AnyConnectOptions) -> Result<Checkpointer> {
    // Its statements are not the store's work: they are not logged, so that what the tests
    // count of a path's statements is the path's alone.
    let mut conn = options
        .clone()
        .log_statements(tracing::log::LevelFilter::Off)
        .connect()
        .await?;
    conn.execute("PRAGMA busy_timeout = 10000").await?;
    let (stop, mut stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = tick.tick() => {}
            }
            if let Err(e) = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").await {
                tracing::warn!(error = %e, "SQLite WAL checkpoint failed; retrying later");
            }
        }
        // The last connection to close copies what is left and removes the log.
        let _ = conn.close().await;
    });
    Ok(Checkpointer {
        stop: Mutex::new(Some(stop)),
        task: Mutex::new(Some(task)),
    })
}
