//! An endpoint's figures as this control plane counts them: requests per second over the last
//! minute, latency and queue-wait percentiles over the latest requests, cold starts, and the
//! ready replicas over the last hour.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gpurent_types::api::{EndpointFigures, ReplicaCount};

/// Samples kept for the percentiles.
const SAMPLES: usize = 2048;
/// Points kept of the replicas over time.
const POINTS: usize = 720;

#[derive(Debug)]
pub struct Figures {
    requests: u64,
    rejected: u64,
    /// Requests answered, per second, over the last minute.
    per_second: VecDeque<(u64, u32)>,
    latencies: VecDeque<Duration>,
    waits: VecDeque<Duration>,
    cold_starts: u64,
    cold: VecDeque<Duration>,
    replicas: VecDeque<(Instant, u32)>,
    epoch: Instant,
}

impl Default for Figures {
    fn default() -> Self {
        Figures {
            requests: 0,
            rejected: 0,
            per_second: VecDeque::new(),
            latencies: VecDeque::new(),
            waits: VecDeque::new(),
            cold_starts: 0,
            cold: VecDeque::new(),
            replicas: VecDeque::new(),
            epoch: Instant::now(),
        }
    }
}

fn push<T>(q: &mut VecDeque<T>, v: T, cap: usize) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(v);
}

/// The `p`th percentile (0..=100) of `samples`, in milliseconds.
fn percentile(samples: &VecDeque<Duration>, p: usize) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted: Vec<Duration> = samples.iter().copied().collect();
    sorted.sort_unstable();
    let i = (sorted.len() * p).div_ceil(100).saturating_sub(1);
    Some(sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1000.0)
}

impl Figures {
    /// A request answered by a replica after `waited` in the queue, `took` in all.
    pub fn answered(&mut self, waited: Duration, took: Duration) {
        self.requests += 1;
        push(&mut self.latencies, took, SAMPLES);
        push(&mut self.waits, waited, SAMPLES);
        let second = self.epoch.elapsed().as_secs();
        match self.per_second.back_mut() {
            Some((s, n)) if *s == second => *n += 1,
            _ => push(&mut self.per_second, (second, 1), 61),
        }
    }

    /// A request the control plane answered itself (429, 502, 503).
    pub fn rejected(&mut self) {
        self.requests += 1;
        self.rejected += 1;
    }

    pub fn cold_start(&mut self, took: Duration) {
        self.cold_starts += 1;
        push(&mut self.cold, took, 256);
    }

    /// The ready replicas changed to `ready`.
    pub fn replicas(&mut self, ready: usize) {
        let ready = u32::try_from(ready).unwrap_or(u32::MAX);
        if self.replicas.back().map(|&(_, n)| n) != Some(ready) {
            push(&mut self.replicas, (Instant::now(), ready), POINTS);
        }
    }

    /// The figures as shown, at `now` (the control plane's clock).
    pub fn view(&self, now: DateTime<Utc>, queued: u32, inflight: u32) -> EndpointFigures {
        let second = self.epoch.elapsed().as_secs();
        let last_minute: u32 = self
            .per_second
            .iter()
            .filter(|(s, _)| second.saturating_sub(*s) < 60)
            .map(|(_, n)| *n)
            .sum();
        let span = second.clamp(1, 60);
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        let requests_per_s = f64::from(last_minute) / span as f64;
        let hour_ago = Instant::now().checked_sub(Duration::from_secs(3600));
        EndpointFigures {
            requests: self.requests,
            requests_per_s,
            p50_ms: percentile(&self.latencies, 50),
            p99_ms: percentile(&self.latencies, 99),
            queue_wait_p50_ms: percentile(&self.waits, 50),
            queue_wait_p99_ms: percentile(&self.waits, 99),
            queued,
            inflight,
            rejected: self.rejected,
            cold_starts: self.cold_starts,
            cold_start_p50_ms: percentile(&self.cold, 50),
            cold_start_p99_ms: percentile(&self.cold, 99),
            replicas_over_time: self
                .replicas
                .iter()
                .filter(|(at, _)| hour_ago.is_none_or(|h| *at >= h))
                .map(|&(at, ready)| ReplicaCount {
                    at: now - chrono::Duration::from_std(at.elapsed()).unwrap_or_default(),
                    ready,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_of_the_samples_kept() {
        let mut f = Figures::default();
        for ms in 1..=100 {
            f.answered(Duration::ZERO, Duration::from_millis(ms));
        }
        let v = f.view(Utc::now(), 0, 0);
        assert_eq!(v.requests, 100);
        assert_eq!(v.p50_ms, Some(50.0));
        assert_eq!(v.p99_ms, Some(99.0));
        assert_eq!(v.queue_wait_p99_ms, Some(0.0));
        assert!(v.requests_per_s > 0.0);
        f.rejected();
        assert_eq!(f.view(Utc::now(), 0, 0).rejected, 1);
    }

    #[test]
    fn replica_points_are_kept_on_change_only() {
        let mut f = Figures::default();
        f.replicas(1);
        f.replicas(1);
        f.replicas(2);
        let v = f.view(Utc::now(), 0, 0);
        let counts: Vec<u32> = v.replicas_over_time.iter().map(|p| p.ready).collect();
        assert_eq!(counts, vec![1, 2]);
    }
}
