//! Login throttling per account in the store: concurrent tries of one account, as from many
//! addresses and replicas at once, get exactly the free tries checked and every other one
//! refused; a success forgets the failures; a burst is one event, for a user only; pruning
//! keeps the newest names that are no user's.

use std::sync::Arc;

use chrono::Duration;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, SqlStore};
use gpurent_types::login_throttle::{Verdict, FIRST_WAIT, FREE_TRIES};

use crate::support::{t0, Fixture};

async fn concurrent_tries_get_only_the_free_ones(backend: Backend) {
    let f = Fixture::new(backend).await;
    let user = f.user("ann", "0").await;
    // A second store on the same database: another replica.
    let other = Arc::new(SqlStore::connect(&f.url()).await.unwrap());
    let tries = (0..30).map(|n| {
        let store = if n % 2 == 0 {
            Arc::clone(&f.store)
        } else {
            Arc::clone(&other)
        };
        let user = user.clone();
        tokio::spawn(async move { store.login_attempt(&user, Some(&user), t0()).await })
    });
    let mut checked = 0;
    for t in tries {
        if t.await.unwrap().unwrap() == Verdict::Check {
            checked += 1;
        }
    }
    assert_eq!(checked, FREE_TRIES, "only the free tries are checked");
    assert_eq!(
        f.store
            .login_attempt(&user, Some(&user), t0())
            .await
            .unwrap(),
        Verdict::Wait {
            until: t0() + FIRST_WAIT
        }
    );
    // 31 tries within the window (more than `BURST`): one burst event.
    let events = f.store.events(0, 100).await.unwrap();
    let bursts: Vec<_> = events.iter().filter(|e| e.kind == "login_burst").collect();
    assert_eq!(bursts.len(), 1, "{events:?}");
    // After the wait one try is checked; a success forgets everything.
    let later = t0() + FIRST_WAIT;
    assert_eq!(
        f.store
            .login_attempt(&user, Some(&user), later)
            .await
            .unwrap(),
        Verdict::Check
    );
    f.store.login_succeeded(&user).await.unwrap();
    for _ in 0..FREE_TRIES {
        assert_eq!(
            f.store
                .login_attempt(&user, Some(&user), later)
                .await
                .unwrap(),
            Verdict::Check
        );
    }
}

async fn names_that_are_no_users_are_bounded(backend: Backend) {
    let f = Fixture::new(backend).await;
    for n in 0..40 {
        let at = t0() + Duration::seconds(n);
        let verdict = f
            .store
            .login_attempt(&format!("name:{n}"), None, at)
            .await
            .unwrap();
        assert_eq!(verdict, Verdict::Check);
    }
    // Twenty tries of one name: a burst, but no event (no user to name).
    for _ in 0..25 {
        f.store.login_attempt("name:x", None, t0()).await.unwrap();
    }
    assert!(f
        .store
        .events(0, 100)
        .await
        .unwrap()
        .iter()
        .all(|e| e.kind != "login_burst"));
    // Keep the newest 10: `name:x` (tried at t0) is among the oldest and goes.
    let pruned = f.store.prune_login_throttle(t0(), 10).await.unwrap();
    assert_eq!(pruned, 31);
    let kept = f
        .store
        .login_attempt("name:39", None, t0() + Duration::seconds(40))
        .await
        .unwrap();
    assert_eq!(kept, Verdict::Check);
    assert_eq!(
        f.store
            .prune_login_throttle(t0() + Duration::days(2), 10)
            .await
            .unwrap(),
        10,
        "failures older than `before` go"
    );
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(Backend::Sqlite).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$name(Backend::Postgres).await;
            }
        }
    )*};
}

on_both!(
    concurrent_tries_get_only_the_free_ones,
    names_that_are_no_users_are_bounded
);
