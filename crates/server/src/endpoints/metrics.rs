//! The endpoints' series in `/metrics`, labelled with each endpoint's name: what this control
//! plane served of it (requests, refusals, latency, queue wait, cold starts) and its replicas.

use std::fmt;

use gpurent_types::api::EndpointFigures;
use gpurent_types::families::{counters, gauges};
use prometheus_client::encoding::DescriptorEncoder;

/// One endpoint's figures at a scrape.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub figures: EndpointFigures,
    pub ready: u32,
    pub starting: u32,
}

/// Every endpoint this control plane knows, by name.
pub fn snapshot(endpoints: &super::Endpoints, now: chrono::DateTime<chrono::Utc>) -> Vec<Series> {
    let mut all: Vec<Series> = endpoints
        .all()
        .iter()
        .map(|live| {
            let inner = live.lock();
            let ready = inner.slots.iter().filter(|s| s.ready).count();
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            Series {
                name: inner.row.name.clone(),
                figures: inner.figures.view(now, inner.queued, inner.inflight()),
                ready: count(ready),
                starting: count(inner.slots.len() - ready),
            }
        })
        .collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    all
}

type Labels = Vec<(&'static str, String)>;

fn by<V>(all: &[Series], value: impl Fn(&Series) -> V) -> Vec<(Labels, V)> {
    all.iter()
        .map(|s| (vec![("endpoint", s.name.clone())], value(s)))
        .collect()
}

/// p50 and p99 of a figure in milliseconds, as seconds labelled with their quantile.
fn quantiles(
    all: &[Series],
    value: impl Fn(&EndpointFigures) -> (Option<f64>, Option<f64>),
) -> Vec<(Labels, f64)> {
    let mut out = Vec::new();
    for s in all {
        let (p50, p99) = value(&s.figures);
        for (q, v) in [("0.5", p50), ("0.99", p99)] {
            if let Some(ms) = v {
                out.push((
                    vec![("endpoint", s.name.clone()), ("quantile", q.to_owned())],
                    ms / 1000.0,
                ));
            }
        }
    }
    out
}

pub fn write(e: &mut DescriptorEncoder, all: &[Series]) -> fmt::Result {
    counters(
        e,
        "gpurent_endpoint_requests_total",
        "Requests to an endpoint at this control plane, answered by a replica or refused.",
        by(all, |s| s.figures.requests),
    )?;
    counters(
        e,
        "gpurent_endpoint_rejected_total",
        "Requests to an endpoint the control plane answered itself (429, 502, 503).",
        by(all, |s| s.figures.rejected),
    )?;
    gauges(
        e,
        "gpurent_endpoint_requests_per_second",
        "Requests answered per second over the last minute.",
        by(all, |s| s.figures.requests_per_s),
    )?;
    gauges(
        e,
        "gpurent_endpoint_latency_seconds",
        "Time to an answer's headers, over the latest requests, by quantile.",
        quantiles(all, |f| (f.p50_ms, f.p99_ms)),
    )?;
    gauges(
        e,
        "gpurent_endpoint_queue_wait_seconds",
        "Time requests waited for a replica, over the latest requests, by quantile.",
        quantiles(all, |f| (f.queue_wait_p50_ms, f.queue_wait_p99_ms)),
    )?;
    counters(
        e,
        "gpurent_endpoint_cold_starts_total",
        "Replicas started while requests waited with none ready.",
        by(all, |s| s.figures.cold_starts),
    )?;
    gauges(
        e,
        "gpurent_endpoint_cold_start_seconds",
        "From a cold replica's start to its first passed health check, by quantile.",
        quantiles(all, |f| (f.cold_start_p50_ms, f.cold_start_p99_ms)),
    )?;
    gauges(
        e,
        "gpurent_endpoint_queued",
        "Requests waiting for a replica now.",
        by(all, |s| i64::from(s.figures.queued)),
    )?;
    gauges(
        e,
        "gpurent_endpoint_inflight",
        "Requests being answered by replicas now.",
        by(all, |s| i64::from(s.figures.inflight)),
    )?;
    let mut replicas = Vec::new();
    for s in all {
        for (state, n) in [("ready", s.ready), ("starting", s.starting)] {
            replicas.push((
                vec![("endpoint", s.name.clone()), ("state", state.to_owned())],
                i64::from(n),
            ));
        }
    }
    gauges(
        e,
        "gpurent_endpoint_replicas",
        "An endpoint's replicas as this control plane sees them: ready, or starting.",
        replicas,
    )
}
