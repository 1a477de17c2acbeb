//! What every PostgreSQL session of the store is set to: a client that stops in the middle of a
//! transaction (a frozen or cut-off replica) has its session ended and its row locks given back,
//! and no statement waits on a lock without bound.

/// Each a PostgreSQL setting and its value, given in the connection's startup packet (no
/// statement, no round trip):
/// - `idle_in_transaction_session_timeout`: a session idle inside a transaction this long is
///   ended by the server, so a replica that froze (SIGSTOP, a stalled VM) or lost its network
///   holds its row locks no longer than this. Our transactions never wait on anything but the
///   database, so a live one is never idle this long.
/// - `lock_timeout`: the longest one statement waits for a lock; longer than the idle timeout,
///   so that a frozen holder's session is ended first and its waiters go on. What outlasts it
///   fails with `lock_not_available`, is tried once more (`retry`) and is then answered 503.
const SETTINGS: [(&str, &str); 2] = [
    ("idle_in_transaction_session_timeout", "4s"),
    ("lock_timeout", "6s"),
];

/// `url` (one PostgreSQL host) with the settings as startup options
/// (`options[name]=value`), placed before the URL's own parameters so that the operator's win.
pub(crate) fn with_settings(url: &str) -> String {
    let ours = SETTINGS
        .iter()
        .map(|(name, value)| format!("options%5B{name}%5D={value}"))
        .collect::<Vec<_>>()
        .join("&");
    match url.split_once('?') {
        Some((base, query)) if !query.is_empty() => format!("{base}?{ours}&{query}"),
        Some((base, _)) => format!("{base}?{ours}"),
        None => format!("{url}?{ours}"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use sqlx::Row;

    use crate::prelude::*;
    use crate::testing::TestDatabase;
    use crate::{Backend, NewUser, SqlStore, StoreError};

    async fn store() -> (TestDatabase, SqlStore) {
        let db = TestDatabase::new(Backend::Postgres)
            .await
            .expect("test database");
        let store = SqlStore::connect(&db.url).await.expect("connect");
        (db, store)
    }

    /// The value given for `name`, and its whole seconds.
    fn value(name: &str) -> (&'static str, u64) {
        let (_, value) = super::SETTINGS
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a setting");
        let seconds = value
            .trim_end_matches('s')
            .parse()
            .expect("a whole number of seconds");
        (value, seconds)
    }

    #[test]
    fn the_settings_go_before_the_urls_own_parameters() {
        let ours =
            "options%5Bidle_in_transaction_session_timeout%5D=4s&options%5Block_timeout%5D=6s";
        assert_eq!(
            super::with_settings("postgres://u@h:1/db"),
            format!("postgres://u@h:1/db?{ours}")
        );
        assert_eq!(
            super::with_settings("postgres://u@h:1/db?sslmode=require"),
            format!("postgres://u@h:1/db?{ours}&sslmode=require")
        );
        assert_eq!(
            super::with_settings("postgres://u@h:1/db?"),
            format!("postgres://u@h:1/db?{ours}")
        );
    }

    #[tokio::test]
    async fn a_transaction_left_idle_is_ended_by_the_server() {
        let (_db, store) = store().await;
        let mut tx = store.begin().await.expect("begin");
        let set: String = sqlx::query("SHOW idle_in_transaction_session_timeout")
            .fetch_one(&mut *tx)
            .await
            .expect("show")
            .try_get(0)
            .expect("text");
        let (idle, seconds) = value("idle_in_transaction_session_timeout");
        assert_eq!(set, idle);
        assert!(
            value("lock_timeout").1 > seconds,
            "a frozen holder is ended before its waiters give up"
        );
        // A frozen replica: nothing sent for longer than the timeout.
        tokio::time::sleep(Duration::from_secs(seconds + 2)).await;
        let e = StoreError::from(tx.commit().await.expect_err("the session was ended"));
        assert!(
            e.is_unavailable(),
            "an ended session is a lost connection, answered 503: {e:?}"
        );
        store.close().await;
    }

    #[tokio::test]
    async fn a_lock_held_too_long_fails_the_waiter_as_overloaded() {
        let (_db, store) = store().await;
        let user = store
            .create_user(
                NewUser {
                    name: "holder".to_owned(),
                    role: gpurent_types::Role::Tenant,
                    token_hash: "hash-holder".to_owned(),
                    credit: gpurent_types::Money::ZERO,
                },
                Utc::now(),
            )
            .await
            .expect("user");
        let lock = "SELECT id FROM users WHERE id = $1 FOR UPDATE";
        let mut holder = store.begin().await.expect("begin");
        sqlx::query(lock)
            .bind(&user.id)
            .execute(&mut *holder)
            .await
            .expect("the holder locks the row");
        let waiter = {
            let (store, id) = (store.clone(), user.id.clone());
            tokio::spawn(async move {
                let mut tx = store.begin().await.expect("begin");
                sqlx::query(lock).bind(&id).execute(&mut *tx).await
            })
        };
        // The holder keeps working (not idle) until the waiter gives up.
        while !waiter.is_finished() {
            sqlx::query("SELECT 1")
                .execute(&mut *holder)
                .await
                .expect("the holder is still alive");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let e = StoreError::from(
            waiter
                .await
                .expect("the waiter task")
                .expect_err("the wait is bounded"),
        );
        assert!(e.is_lock_timeout(), "{e:?}");
        assert!(e.is_overloaded(), "answered 503, not 500: {e:?}");
        holder.commit().await.expect("the holder commits");
        store.close().await;
    }
}
