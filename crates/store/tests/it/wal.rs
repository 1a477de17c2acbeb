//! SQLite's log is copied into the database file by the store's own checkpointer (automatic
//! checkpoints are off on its connection), while the store stays open, and removed at close.

use std::time::{Duration, Instant};

use gpurent_store::Backend;
use gpurent_types::Money;

use crate::support::{t0, Fixture};

#[tokio::test]
async fn the_log_is_checkpointed_while_open_and_removed_at_close() {
    let f = Fixture::new(Backend::Sqlite).await;
    let path = f.url().trim_start_matches("sqlite://").to_owned();
    let wal = format!("{path}-wal");
    let size = |p: &str| std::fs::metadata(p).map_or(0, |m| m.len());
    let before = size(&path);

    let node = f.node("n1", "NVIDIA GeForce RTX 4090", 1).await;
    let tenant = f.user("t", "1000000").await;
    // About 4 MiB of rows, all of it in the log at first.
    f.store
        .seed_running_reservations(&tenant, &node, 20_000, Money::units(1), t0())
        .await
        .unwrap();
    assert!(size(&wal) > 0, "the rows went into the log first");

    let deadline = Instant::now() + Duration::from_secs(30);
    while size(&path) <= before + 1024 * 1024 {
        assert!(
            Instant::now() < deadline,
            "the database file stayed at {} bytes (it was {before}): nothing checkpointed the log",
            size(&path)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    f.store.close().await;
    assert!(
        !std::path::Path::new(&wal).exists(),
        "the log is left behind after close"
    );
}
