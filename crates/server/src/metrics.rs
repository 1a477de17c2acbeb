//! The control plane's Prometheus metrics: what only this process sees (API latency by route
//! template, placement waits, the nodes it fenced) kept in memory, and the rendering of
//! `/metrics` with the figures the store reads at scrape time (`Store::metrics_view`), in the
//! Prometheus text format (0.0.4) as `prometheus-client` writes it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpurent_store::MetricsView;
use gpurent_types::families::{counters, gauges};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    prometheus_text, CounterValueEncoder, DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue,
    EncodeLabelSet, EncodeMetric, GaugeValueEncoder,
};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The `Content-Type` of `/metrics`: the Prometheus text format, version 0.0.4.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Request latency bounds (s): long polls of agents are held up to `max_sync_wait` (10 s).
const HTTP_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Placement wait bounds (s), around the seeds' target of an average wait under 15 s.
const WAIT_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Node statuses always exposed (0 when none), so that alert rules find a series.
const NODE_STATUSES: [&str; 6] = [
    "ready",
    "unreachable",
    "unverified",
    "unhealthy",
    "draining",
    "lost",
];

/// An API request's series: its route template, method and status class.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Route {
    route: String,
    method: String,
    status: &'static str,
}

/// What this control plane process counts itself. Shared by every handler (`AppState`).
#[derive(Debug)]
pub struct Metrics {
    http: Family<Route, Histogram, fn() -> Histogram>,
    waits: Histogram,
    nodes_lost: AtomicU64,
    rescheduled: AtomicU64,
    ended_by_loss: AtomicU64,
    connections: ConnectionCounts,
    /// The SSH endpoint and the agents' tunnels (`ssh/`, `tunnel/`).
    pub ssh: SshCounts,
    /// The HTTP proxy to published ports (`proxy/`).
    pub proxy: ProxyCounts,
}

/// What the HTTP proxy forwarded: requests, WebSocket upgrades (and those open now), and
/// requests answered 502.
#[derive(Debug, Default)]
pub struct ProxyCounts {
    pub requests: AtomicU64,
    pub upgrades: AtomicU64,
    pub websockets: AtomicU64,
    pub bad_gateway: AtomicU64,
}

/// What the SSH endpoint relays: channels open now, bytes, and agents' tunnels held.
#[derive(Debug, Default)]
pub struct SshCounts {
    pub sessions: AtomicU64,
    pub forwards: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub tunnels: AtomicU64,
}

impl SshCounts {
    /// Lowers a gauge, never below zero.
    pub fn down(gauge: &AtomicU64) {
        let _ = gauge.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// What the HTTP listener did with its connections (`serve/`).
#[derive(Debug, Default)]
struct ConnectionCounts {
    open: AtomicU64,
    refused_per_ip: AtomicU64,
    refused_total: AtomicU64,
    closed_header: AtomicU64,
    closed_idle: AtomicU64,
    closed_body: AtomicU64,
}

/// A connection of the HTTP listener opened, closed, refused over a cap, or closed for being
/// slow to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionEvent {
    Opened,
    Closed,
    RefusedPerIp,
    RefusedTotal,
    SlowHeader,
    SlowIdle,
    SlowBody,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            http: Family::new_with_constructor(|| Histogram::new(HTTP_BUCKETS.iter().copied())),
            waits: Histogram::new(WAIT_BUCKETS.iter().copied()),
            nodes_lost: AtomicU64::new(0),
            rescheduled: AtomicU64::new(0),
            ended_by_loss: AtomicU64::new(0),
            connections: ConnectionCounts::default(),
            ssh: SshCounts::default(),
            proxy: ProxyCounts::default(),
        }
    }
}

/// `2xx`, `4xx`, ...: the status class keeps the number of series small.
fn status_class(status: u16) -> &'static str {
    match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

impl Metrics {
    /// An API request answered: `route` is the matched route template (`/api/v1/reservations/{id}`),
    /// never the path with its ids, so that the series stay few.
    pub fn observe_request(&self, route: &str, method: &str, status: u16, took: Duration) {
        let key = Route {
            route: route.to_owned(),
            method: method.to_owned(),
            status: status_class(status),
        };
        self.http.get_or_create(&key).observe(took.as_secs_f64());
    }

    /// A reservation got its GPUs this long after it asked (or was queued again): 0 for one
    /// placed at once.
    pub fn observe_wait(&self, waited: Duration) {
        self.waits.observe(waited.as_secs_f64());
    }

    /// The maintenance loop fenced these nodes, and queued again or ended their work.
    pub fn observe_fencing(&self, nodes: usize, rescheduled: usize, ended: usize) {
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        self.nodes_lost.fetch_add(n(nodes), Ordering::Relaxed);
        self.rescheduled
            .fetch_add(n(rescheduled), Ordering::Relaxed);
        self.ended_by_loss.fetch_add(n(ended), Ordering::Relaxed);
    }

    pub fn observe_connection(&self, event: ConnectionEvent) {
        let c = &self.connections;
        let counter = match event {
            ConnectionEvent::Opened => &c.open,
            ConnectionEvent::Closed => {
                // Saturating: a gauge never wraps below zero.
                let _ = c
                    .open
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
                return;
            }
            ConnectionEvent::RefusedPerIp => &c.refused_per_ip,
            ConnectionEvent::RefusedTotal => &c.refused_total,
            ConnectionEvent::SlowHeader => &c.closed_header,
            ConnectionEvent::SlowIdle => &c.closed_idle,
            ConnectionEvent::SlowBody => &c.closed_body,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The text exposition of everything: this process's series and the store's `view` at `now`.
    pub fn render(
        &self,
        view: &MetricsView,
        endpoints: Vec<crate::endpoints::metrics::Series>,
        now: DateTime<Utc>,
    ) -> String {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let (c, s, p) = (&self.connections, &self.ssh, &self.proxy);
        let scrape = Scrape {
            http: self.http.clone(),
            waits: self.waits.clone(),
            counts: Counts {
                connections: load(&c.open),
                refused: [load(&c.refused_per_ip), load(&c.refused_total)],
                slow: [
                    load(&c.closed_header),
                    load(&c.closed_idle),
                    load(&c.closed_body),
                ],
                sessions: load(&s.sessions),
                forwards: load(&s.forwards),
                bytes: [load(&s.bytes_in), load(&s.bytes_out)],
                tunnels: load(&s.tunnels),
                proxy_requests: load(&p.requests),
                proxy_upgrades: load(&p.upgrades),
                proxy_websockets: load(&p.websockets),
                proxy_bad_gateway: load(&p.bad_gateway),
                nodes_lost: load(&self.nodes_lost),
                failovers: [load(&self.rescheduled), load(&self.ended_by_loss)],
            },
            view: view.clone(),
            endpoints,
            now,
        };
        // A registry per scrape: the store's figures are read for this scrape only.
        let mut registry = Registry::default();
        registry.register_collector(Box::new(scrape));
        let mut text = String::new();
        if let Err(e) = prometheus_text::encode(&mut text, &registry) {
            tracing::warn!(error = %e, "the metrics could not be written");
        }
        text
    }
}

/// Unlabelled: the one sample of a family.
const NONE: [(&str, &str); 0] = [];

/// A number of millionths (money's micro-units, microseconds) as the exposition writes it:
/// whole units as an integer (`7`), others as the float that prints its exact decimals
/// (`12.000345`) up to 15 significant digits, which is what a Prometheus sample holds.
#[derive(Debug, Clone, Copy)]
struct Millionths(i64);

impl Millionths {
    #[allow(clippy::cast_precision_loss)]
    fn units(self) -> Result<u64, f64> {
        match u64::try_from(self.0) {
            Ok(n) if n % 1_000_000 == 0 => Ok(n / 1_000_000),
            _ => Err(self.0 as f64 / 1e6),
        }
    }
}

impl EncodeGaugeValue for Millionths {
    fn encode(&self, encoder: &mut GaugeValueEncoder) -> fmt::Result {
        match self.units() {
            Ok(n) => EncodeGaugeValue::encode(&n, encoder),
            Err(x) => EncodeGaugeValue::encode(&x, encoder),
        }
    }
}

impl EncodeCounterValue for Millionths {
    fn encode(&self, encoder: &mut CounterValueEncoder) -> fmt::Result {
        match self.units() {
            Ok(n) => EncodeCounterValue::encode(&n, encoder),
            Err(x) => EncodeCounterValue::encode(&x, encoder),
        }
    }
}

/// What one scrape writes: this process's series (histograms shared, counters read once) and
/// the store's figures.
#[derive(Debug)]
struct Scrape {
    http: Family<Route, Histogram, fn() -> Histogram>,
    waits: Histogram,
    counts: Counts,
    view: MetricsView,
    endpoints: Vec<crate::endpoints::metrics::Series>,
    now: DateTime<Utc>,
}

/// This process's counters and gauges, read at the start of a scrape.
#[derive(Debug)]
struct Counts {
    connections: u64,
    /// per_ip, total
    refused: [u64; 2],
    /// header, idle, body
    slow: [u64; 3],
    sessions: u64,
    forwards: u64,
    /// in, out
    bytes: [u64; 2],
    tunnels: u64,
    proxy_requests: u64,
    proxy_upgrades: u64,
    proxy_websockets: u64,
    proxy_bad_gateway: u64,
    nodes_lost: u64,
    /// rescheduled, ended
    failovers: [u64; 2],
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let family = e.encode_descriptor(
            "gpurent_http_request_duration_seconds",
            "Time to answer an API request, by route template, method and status class.",
            None,
            MetricType::Histogram,
        )?;
        self.http.encode(family)?;
        write_connections(&mut e, &self.counts)?;
        write_ssh(&mut e, &self.counts)?;
        write_proxy(&mut e, &self.counts)?;
        write_fleet(&mut e, &self.view, self.now)?;
        let family = e.encode_descriptor(
            "gpurent_reservation_wait_seconds",
            "Time from a reservation's request (or its requeue after a node loss) to its placement on GPUs, 0 when placed at once (placements by this control plane).",
            None,
            MetricType::Histogram,
        )?;
        self.waits.encode(family)?;
        write_failovers(&mut e, &self.counts)?;
        crate::endpoints::metrics::write(&mut e, &self.endpoints)?;
        write_money(&mut e, &self.view)
    }
}

fn write_connections(e: &mut DescriptorEncoder, c: &Counts) -> fmt::Result {
    gauges(
        e,
        "gpurent_http_connections",
        "Connections open on the API listener.",
        [(NONE, c.connections)],
    )?;
    counters(
        e,
        "gpurent_http_connections_refused_total",
        "Connections refused when accepted, over the cap per client address (per_ip) or in all (total).",
        [
            ([("cap", "per_ip")], c.refused[0]),
            ([("cap", "total")], c.refused[1]),
        ],
    )?;
    counters(
        e,
        "gpurent_http_slow_clients_closed_total",
        "Connections closed for being slow to send: a request header (header), a next request (idle) or a body (body) not in time.",
        [
            ([("reason", "header")], c.slow[0]),
            ([("reason", "idle")], c.slow[1]),
            ([("reason", "body")], c.slow[2]),
        ],
    )
}

fn write_ssh(e: &mut DescriptorEncoder, c: &Counts) -> fmt::Result {
    gauges(
        e,
        "gpurent_ssh_sessions",
        "Sessions into instances open through this replica: SSH session channels (shells, commands, SFTP) and web console terminals.",
        [(NONE, c.sessions)],
    )?;
    gauges(
        e,
        "gpurent_ssh_forwards",
        "Forwarded TCP connections (ssh -L) open through this replica.",
        [(NONE, c.forwards)],
    )?;
    counters(
        e,
        "gpurent_ssh_bytes_total",
        "Bytes relayed between SSH clients or web console terminals and instances: in (to the instance) and out.",
        [
            ([("direction", "in")], c.bytes[0]),
            ([("direction", "out")], c.bytes[1]),
        ],
    )?;
    gauges(
        e,
        "gpurent_agent_tunnels",
        "Agents' tunnels held open to this replica.",
        [(NONE, c.tunnels)],
    )
}

fn write_proxy(e: &mut DescriptorEncoder, c: &Counts) -> fmt::Result {
    counters(
        e,
        "gpurent_proxy_requests_total",
        "Requests forwarded to published HTTP ports of instances (WebSocket upgrades too).",
        [(NONE, c.proxy_requests)],
    )?;
    counters(
        e,
        "gpurent_proxy_websocket_upgrades_total",
        "WebSocket (and other) upgrades the apps behind published ports switched to.",
        [(NONE, c.proxy_upgrades)],
    )?;
    gauges(
        e,
        "gpurent_proxy_websockets",
        "WebSockets to published ports open through this replica.",
        [(NONE, c.proxy_websockets)],
    )?;
    counters(
        e,
        "gpurent_proxy_bad_gateway_total",
        "Proxied requests answered 502: nothing listens on the port, or no agent tunnel.",
        [(NONE, c.proxy_bad_gateway)],
    )
}

fn write_failovers(e: &mut DescriptorEncoder, c: &Counts) -> fmt::Result {
    counters(
        e,
        "gpurent_nodes_lost_total",
        "Nodes this control plane fenced as lost (not heard from for the node TTL).",
        [(NONE, c.nodes_lost)],
    )?;
    counters(
        e,
        "gpurent_failovers_total",
        "Reservations of lost nodes fenced by this control plane: queued again to run elsewhere (rescheduled) or ended (ended).",
        [
            ([("outcome", "rescheduled")], c.failovers[0]),
            ([("outcome", "ended")], c.failovers[1]),
        ],
    )
}

fn write_fleet(e: &mut DescriptorEncoder, view: &MetricsView, now: DateTime<Utc>) -> fmt::Result {
    gauges(
        e,
        "gpurent_gpus",
        "GPUs of live nodes by type: free (no memory allocated) or allocated (whole, or any share of it).",
        view.gpus.iter().flat_map(|(gpu_type, c)| {
            [
                ([("gpu_type", gpu_type.as_str()), ("state", "free")], c.free),
                (
                    [("gpu_type", gpu_type.as_str()), ("state", "allocated")],
                    c.allocated,
                ),
            ]
        }),
    )?;
    let mib = |mb: u64| mb.saturating_mul(1024 * 1024);
    gauges(
        e,
        "gpurent_gpu_memory_bytes",
        "GPU memory of live nodes by GPU type: free, or allocated to reservations.",
        view.gpus.iter().flat_map(|(gpu_type, c)| {
            [
                (
                    [("gpu_type", gpu_type.as_str()), ("state", "free")],
                    mib(c.free_mb),
                ),
                (
                    [("gpu_type", gpu_type.as_str()), ("state", "allocated")],
                    mib(c.vram_mb.saturating_sub(c.free_mb)),
                ),
            ]
        }),
    )?;
    gauges(
        e,
        "gpurent_queue_length",
        "Reservations queued for GPUs, by the GPU type they wait for.",
        view.queued
            .iter()
            .map(|(gpu_type, (n, _))| ([("gpu_type", gpu_type.as_str())], *n)),
    )?;
    gauges(
        e,
        "gpurent_queue_oldest_wait_seconds",
        "How long the reservation queued first has been waiting, by GPU type.",
        view.queued.iter().map(|(gpu_type, (_, oldest))| {
            let waited = oldest.map_or(0, |t| (now - t).num_microseconds().unwrap_or(0).max(0));
            ([("gpu_type", gpu_type.as_str())], Millionths(waited))
        }),
    )?;
    let others = view
        .nodes
        .iter()
        .filter(|(s, _)| !NODE_STATUSES.contains(&s.as_str()))
        .map(|(status, n)| ([("status", status.as_str())], *n));
    gauges(
        e,
        "gpurent_nodes",
        "Nodes by status, as `gpurent nodes ls` shows it.",
        NODE_STATUSES
            .iter()
            .map(|status| {
                let n = view.nodes.get(*status).copied().unwrap_or(0);
                ([("status", *status)], n)
            })
            .chain(others),
    )?;
    gauges(
        e,
        "gpurent_reservations",
        "Reservations by status and tier (ended ones included).",
        view.reservations.iter().map(|((status, tier), n)| {
            ([("status", status.as_str()), ("tier", tier.as_str())], *n)
        }),
    )?;
    counters(
        e,
        "gpurent_preemptions_total",
        "Spot reservations preempted to make room for other work.",
        [(NONE, view.preempted)],
    )?;
    counters(
        e,
        "gpurent_spot_instances_ended_total",
        "Spot instances that ran and ended: completed (their end or their tenant's stop) or interrupted by the platform (preempted, or stopped by their node).",
        [
            ([("outcome", "completed")], view.spot.completed),
            ([("outcome", "interrupted")], view.spot.interrupted),
        ],
    )?;
    gauges(
        e,
        "gpurent_spot_success_ratio",
        "Completed spot instances over all that ended, since the start (GET /api/v1/admin/spot); no sample before the first ends.",
        view.spot.success_rate.map(|rate| (NONE, rate)),
    )
}

fn write_money(e: &mut DescriptorEncoder, view: &MetricsView) -> fmt::Result {
    // Integer micro-units to the end: the one division is the exposition's own float.
    counters(
        e,
        "gpurent_revenue_total",
        "Everything charged to tenants, in the platform's currency (gross, host shares included).",
        [(NONE, Millionths(view.charged.micros()))],
    )?;
    counters(
        e,
        "gpurent_host_earnings_total",
        "The part of the charges paid to the nodes' owners, in the platform's currency.",
        [(NONE, Millionths(view.host_earnings.micros()))],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_each_observation_in_its_bucket_and_cumulates() {
        let m = Metrics::default();
        m.observe_request("/a/{id}", "GET", 200, Duration::from_millis(3));
        m.observe_request("/a/{id}", "GET", 204, Duration::from_millis(40));
        m.observe_request("/a/{id}", "GET", 404, Duration::from_secs(60));
        let text = m.render(&MetricsView::default(), Vec::new(), Utc::now());
        let series = "route=\"/a/{id}\",method=\"GET\",status=\"2xx\"";
        assert!(text.contains(&format!(
            "gpurent_http_request_duration_seconds_bucket{{{series},le=\"0.005\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "gpurent_http_request_duration_seconds_bucket{{{series},le=\"0.05\"}} 2\n"
        )));
        // The sum of the observations in seconds (a float, as client_golang's).
        let sum = format!("gpurent_http_request_duration_seconds_sum{{{series}}} ");
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&sum))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {sum} in\n{text}"));
        assert!((sum - 0.043).abs() < 1e-9, "{sum}");
        let slow = "route=\"/a/{id}\",method=\"GET\",status=\"4xx\"";
        assert!(text.contains(&format!(
            "gpurent_http_request_duration_seconds_bucket{{{slow},le=\"30\"}} 0\n"
        )));
        assert!(text.contains(&format!(
            "gpurent_http_request_duration_seconds_bucket{{{slow},le=\"+Inf\"}} 1\n"
        )));
        assert!(text.contains("gpurent_nodes{status=\"lost\"} 0\n"));
    }
}
