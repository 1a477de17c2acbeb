//! The thread the reservation writer runs on, with a runtime of its own. Every reservation
//! queues for the writer, and each of its round trips to the database waited for a worker of
//! the server's runtime, which the requests themselves keep busy: a bare `BEGIN` took a
//! millisecond under load. On its own thread a reply wakes the writer at once.

use tokio::sync::mpsc;

use super::SqlStore;

/// The writer's thread: each store sent runs its writer there until no request waits.
#[derive(Debug)]
pub(super) struct WriterThread {
    start: mpsc::UnboundedSender<SqlStore>,
}

impl WriterThread {
    /// Starts the thread; `None` where the system gives no thread or runtime (the writer
    /// then runs on the caller's runtime, as a task). The thread ends when this is dropped.
    pub(super) fn start() -> Option<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| tracing::warn!(error = %e, "no runtime for the reservation writer; it runs with the requests"))
            .ok()?;
        let (start, mut stores) = mpsc::unbounded_channel::<SqlStore>();
        std::thread::Builder::new()
            .name("gpurent-writer".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    while let Some(store) = stores.recv().await {
                        // A task, so that a panic ends one run of the writer, not the thread.
                        if let Err(e) = tokio::spawn(store.write_combined()).await {
                            tracing::error!(error = %e, "the reservation writer failed");
                        }
                    }
                });
            })
            .map_err(|e| tracing::warn!(error = %e, "no thread for the reservation writer; it runs with the requests"))
            .ok()?;
        Some(WriterThread { start })
    }

    /// Runs `store`'s writer on the thread, or on the caller's runtime if the thread is gone.
    pub(super) fn run(&self, store: SqlStore) {
        if let Err(mpsc::error::SendError(store)) = self.start.send(store) {
            tokio::spawn(store.write_combined());
        }
    }
}
