//! Short-lived caches of credentials found valid, so that a client's requests do not each read
//! their credential: API tokens (`check_token`) and node credentials (`authenticate_node`, read
//! by every agent sync). A revocation or role change made through this store empties the cache at
//! once; one made by another control plane on the same database takes effect here within the
//! cache's TTL.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a valid API token is trusted without reading it again.
pub(crate) const TOKEN_TTL: Duration = Duration::from_secs(1);

/// How long a node credential is trusted without reading it again: longer than the time
/// between one agent's syncs (about 1.5 s at the default heartbeat), so that most syncs skip
/// the read. A node revoked through another replica is refused here within this.
pub(crate) const NODE_TTL: Duration = Duration::from_secs(5);

/// Entries remembered at most; past that the cache starts over (a flood of credentials costs
/// reads, never memory).
const MAX_ENTRIES: usize = 10_000;

/// Values read for a key (a credential's hash), each trusted for the TTL.
#[derive(Debug)]
pub(crate) struct ReadCache<V> {
    ttl: Duration,
    inner: Mutex<Inner<V>>,
}

#[derive(Debug)]
struct Inner<V> {
    /// Bumped by every change that can turn a valid credential invalid, so that a read which
    /// began before the change cannot put its answer in after it.
    generation: u64,
    entries: HashMap<String, (V, Instant)>,
}

impl<V: Clone> ReadCache<V> {
    pub(crate) fn new(ttl: Duration) -> Self {
        ReadCache {
            ttl,
            inner: Mutex::new(Inner {
                generation: 0,
                entries: HashMap::new(),
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner<V>) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The value of `key` read within the TTL and still `valid`, and otherwise the generation
    /// that [`ReadCache::put`] needs after reading it.
    pub(crate) fn get(&self, key: &str, valid: impl FnOnce(&V) -> bool) -> Result<V, u64> {
        self.with(|inner| {
            match inner
                .entries
                .get(key)
                .filter(|(value, read_at)| read_at.elapsed() < self.ttl && valid(value))
            {
                Some((value, _)) => Ok(value.clone()),
                None => Err(inner.generation),
            }
        })
    }

    /// Remembers a valid value read at `generation` (its read began at `read_at`), unless
    /// something was revoked since.
    pub(crate) fn put(&self, key: &str, generation: u64, read_at: Instant, value: V) {
        self.with(|inner| {
            if inner.generation != generation {
                return;
            }
            if inner.entries.len() >= MAX_ENTRIES {
                inner.entries.clear();
            }
            inner.entries.insert(key.to_owned(), (value, read_at));
        });
    }

    /// Forgets everything: a credential was revoked or a user's role changed.
    pub(crate) fn clear(&self) {
        self.with(|inner| {
            inner.generation += 1;
            inner.entries.clear();
        });
    }
}
