//! A short-lived cache of the tokens found valid, so that a client's requests do not each read
//! its token (on SQLite, a statement on the one connection that every transaction waits for).
//! A revocation or role change made through this store empties it at once; one made by
//! another control plane on the same database takes effect here within [`TTL`].

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::{AuthUser, TokenFacts};

/// How long a valid check is trusted without reading the token again.
pub(crate) const TTL: Duration = Duration::from_secs(1);

/// Tokens remembered at most; past that the cache starts over (a flood of tokens costs
/// reads, never memory).
const MAX_ENTRIES: usize = 10_000;

#[derive(Debug, Default)]
pub(crate) struct TokenCache(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// Bumped by every change that can turn a valid token invalid, so that a read which
    /// began before the change cannot put its answer in after it.
    generation: u64,
    entries: HashMap<String, Cached>,
}

#[derive(Debug, Clone)]
struct Cached {
    user: AuthUser,
    token: TokenFacts,
    read_at: Instant,
}

impl TokenCache {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The valid check of `token_hash` read within the TTL and not expired at `now`, and
    /// otherwise the generation that [`TokenCache::put`] needs after reading it.
    pub(crate) fn get(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<(AuthUser, TokenFacts), u64> {
        self.with(|inner| {
            let fresh = inner.entries.get(token_hash).filter(|c| {
                c.read_at.elapsed() < TTL && c.token.expires_at.is_none_or(|at| now < at)
            });
            match fresh {
                Some(c) => Ok((c.user.clone(), c.token.clone())),
                None => Err(inner.generation),
            }
        })
    }

    /// Remembers a valid check read at `generation`, unless something was revoked since.
    pub(crate) fn put(
        &self,
        token_hash: &str,
        generation: u64,
        read_at: Instant,
        user: &AuthUser,
        token: &TokenFacts,
    ) {
        self.with(|inner| {
            if inner.generation != generation {
                return;
            }
            if inner.entries.len() >= MAX_ENTRIES {
                inner.entries.clear();
            }
            inner.entries.insert(
                token_hash.to_owned(),
                Cached {
                    user: user.clone(),
                    token: token.clone(),
                    read_at,
                },
            );
        });
    }

    /// Forgets every check: a token was revoked or a user's role changed.
    pub(crate) fn clear(&self) {
        self.with(|inner| {
            inner.generation += 1;
            inner.entries.clear();
        });
    }
}
