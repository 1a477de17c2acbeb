//! Rate limits per token and per client address: token buckets in memory (per replica), and
//! the middleware that answers 429 with `Retry-After`. Agents' routes and endpoints' URLs are
//! exempt.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth::hash_token;
use crate::error::ApiError;
use crate::state::AppState;

/// A sustained rate and the burst allowed above it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: u32,
}

/// The limits of the API (`None`: no limit of that kind).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimits {
    /// Per bearer token: 20 requests a second, bursts of 40.
    pub per_token: Option<Rate>,
    /// Per client address (the proxy's, behind one): 50 a second, bursts of 100.
    pub per_address: Option<Rate>,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            per_token: Some(Rate {
                per_second: 20.0,
                burst: 40,
            }),
            per_address: Some(Rate {
                per_second: 50.0,
                burst: 100,
            }),
        }
    }
}

/// Buckets kept before idle full ones are dropped.
const MAX_BUCKETS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets of one rate, by key; no rate: no limit. A reload may change the rate.
#[derive(Debug, Default)]
pub struct Limiter {
    inner: Mutex<Buckets>,
}

#[derive(Debug, Default)]
struct Buckets {
    rate: Option<Rate>,
    by_key: HashMap<String, Bucket>,
}

impl Limiter {
    pub fn new(rate: Option<Rate>) -> Self {
        Limiter {
            inner: Mutex::new(Buckets {
                rate,
                by_key: HashMap::new(),
            }),
        }
    }

    /// From now on, `rate` (the buckets keep their tokens, up to the new burst).
    pub fn set_rate(&self, rate: Option<Rate>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.rate = rate;
        if rate.is_none() {
            inner.by_key.clear();
        }
    }

    /// Takes one token from `key`'s bucket at `now`, or says how long until one is there.
    pub fn take(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(rate) = inner.rate else {
            return Ok(());
        };
        let burst = f64::from(rate.burst.max(1));
        let per_second = rate.per_second.max(f64::MIN_POSITIVE);
        let buckets = &mut inner.by_key;
        if buckets.len() >= MAX_BUCKETS {
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.at).as_secs_f64() * per_second < burst
            });
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refilled = now.duration_since(bucket.at).as_secs_f64() * per_second;
        bucket.tokens = (bucket.tokens + refilled).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / per_second;
            Err(Duration::try_from_secs_f64(wait).unwrap_or(Duration::MAX))
        }
    }
}

/// The limiters of one control plane process.
#[derive(Debug, Default)]
pub struct RateLimiters {
    per_token: Limiter,
    per_address: Limiter,
}

impl RateLimiters {
    pub fn new(limits: &RateLimits) -> Self {
        RateLimiters {
            per_token: Limiter::new(limits.per_token),
            per_address: Limiter::new(limits.per_address),
        }
    }

    /// The rates of a reload.
    pub fn set(&self, limits: &RateLimits) {
        self.per_token.set_rate(limits.per_token);
        self.per_address.set_rate(limits.per_address);
    }
}

/// Refuses a request over its address's or its token's rate with 429 and `Retry-After`.
pub(crate) async fn limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let exempt = request.extensions().get::<MatchedPath>().is_some_and(|p| {
        // Agents, and endpoints' traffic (the app's callers, bounded by its queue).
        p.as_str().starts_with("/api/v1/agent/") || p.as_str().starts_with("/e/")
    });
    if !exempt {
        let now = Instant::now();
        let limits = &state.rate_limits;
        // A console page's own API calls: its address paid for the page.
        let internal = request
            .extensions()
            .get::<crate::console::api::Internal>()
            .is_some();
        let address = request
            .extensions()
            .get::<ConnectInfo<crate::tls::Peer>>()
            .filter(|_| !internal)
            .map(|ConnectInfo(peer)| peer.addr.ip().to_string());
        if let Some(address) = address {
            if let Err(wait) = limits.per_address.take(&address, now) {
                return ApiError::RateLimited { retry_after: wait }.into_response();
            }
        }
        let token = crate::auth::bearer(request.headers()).ok().map(hash_token);
        if let Some(token) = token {
            if let Err(wait) = limits.per_token.take(&token, now) {
                return ApiError::RateLimited { retry_after: wait }.into_response();
            }
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_refills_at_its_rate() {
        let limiter = Limiter::new(Some(Rate {
            per_second: 2.0,
            burst: 3,
        }));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limiter.take("a", t0).is_ok());
        }
        let wait = limiter.take("a", t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(limiter.take("b", t0).is_ok(), "keys are independent");
        assert!(limiter.take("a", t0 + Duration::from_millis(500)).is_ok());
        assert!(limiter.take("a", t0 + Duration::from_millis(500)).is_err());
        // Never more than the burst, however long it rested.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert!(limiter.take("a", later).is_ok());
        }
        assert!(limiter.take("a", later).is_err());
    }
}
