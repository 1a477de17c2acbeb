//! The control plane's Prometheus metrics: what only this process sees (API latency by route
//! template, placement waits, the nodes it fenced) kept in memory, and the rendering of
//! `/metrics` with the figures the store reads at scrape time (`Store::metrics_view`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpurent_store::MetricsView;
use gpurent_types::exposition::{micros, Exposition, HistogramSample, Kind};

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

/// One histogram series: a count per bound (not cumulative), the sum in microseconds.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum_us: i64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum_us: 0,
            count: 0,
        }
    }

    fn observe(&mut self, value: Duration) {
        let secs = value.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.counts[i] += 1;
        }
        self.sum_us = self
            .sum_us
            .saturating_add(i64::try_from(value.as_micros()).unwrap_or(i64::MAX));
        self.count += 1;
    }

    fn write(&self, e: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let mut running = 0;
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| {
                running += c;
                (*b, running)
            })
            .collect();
        e.histogram(
            name,
            labels,
            &HistogramSample {
                buckets: &buckets,
                sum: micros(self.sum_us),
                count: self.count,
            },
        );
    }
}

/// An API request's series: its route template, method and status class.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Route {
    route: String,
    method: String,
    status: &'static str,
}

/// What this control plane process counts itself. Shared by every handler (`AppState`).
#[derive(Debug)]
pub struct Metrics {
    http: Mutex<BTreeMap<Route, Histogram>>,
    waits: Mutex<Histogram>,
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
            http: Mutex::default(),
            waits: Mutex::new(Histogram::new(WAIT_BUCKETS)),
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
        self.http
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(key)
            .or_insert_with(|| Histogram::new(HTTP_BUCKETS))
            .observe(took);
    }

    /// A reservation got its GPUs this long after it asked (or was queued again): 0 for one
    /// placed at once.
    pub fn observe_wait(&self, waited: Duration) {
        self.waits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .observe(waited);
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
    pub fn render(&self, view: &MetricsView, now: DateTime<Utc>) -> String {
        let mut e = Exposition::new();
        self.write_http(&mut e);
        self.write_connections(&mut e);
        self.write_ssh(&mut e);
        self.write_proxy(&mut e);
        write_fleet(&mut e, view, now);
        self.write_events(&mut e);
        write_money(&mut e, view);
        e.finish()
    }

    fn write_http(&self, e: &mut Exposition) {
        let name = "gpurent_http_request_duration_seconds";
        e.family(
            name,
            Kind::Histogram,
            "Time to answer an API request, by route template, method and status class.",
        );
        let http = self
            .http
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for (key, h) in &http {
            h.write(
                e,
                name,
                &[
                    ("route", &key.route),
                    ("method", &key.method),
                    ("status", key.status),
                ],
            );
        }
    }

    fn write_ssh(&self, e: &mut Exposition) {
        let s = &self.ssh;
        e.single(
            "gpurent_ssh_sessions",
            Kind::Gauge,
            "Sessions into instances open through this replica: SSH session channels (shells, commands, SFTP) and web console terminals.",
            s.sessions.load(Ordering::Relaxed),
        );
        e.single(
            "gpurent_ssh_forwards",
            Kind::Gauge,
            "Forwarded TCP connections (ssh -L) open through this replica.",
            s.forwards.load(Ordering::Relaxed),
        );
        let name = "gpurent_ssh_bytes_total";
        e.family(
            name,
            Kind::Counter,
            "Bytes relayed between SSH clients or web console terminals and instances: in (to the instance) and out.",
        );
        e.sample(
            name,
            &[("direction", "in")],
            s.bytes_in.load(Ordering::Relaxed),
        );
        e.sample(
            name,
            &[("direction", "out")],
            s.bytes_out.load(Ordering::Relaxed),
        );
        e.single(
            "gpurent_agent_tunnels",
            Kind::Gauge,
            "Agents' tunnels held open to this replica.",
            s.tunnels.load(Ordering::Relaxed),
        );
    }

    fn write_proxy(&self, e: &mut Exposition) {
        let p = &self.proxy;
        e.single(
            "gpurent_proxy_requests_total",
            Kind::Counter,
            "Requests forwarded to published HTTP ports of instances (WebSocket upgrades too).",
            p.requests.load(Ordering::Relaxed),
        );
        e.single(
            "gpurent_proxy_websocket_upgrades_total",
            Kind::Counter,
            "WebSocket (and other) upgrades the apps behind published ports switched to.",
            p.upgrades.load(Ordering::Relaxed),
        );
        e.single(
            "gpurent_proxy_websockets",
            Kind::Gauge,
            "WebSockets to published ports open through this replica.",
            p.websockets.load(Ordering::Relaxed),
        );
        e.single(
            "gpurent_proxy_bad_gateway_total",
            Kind::Counter,
            "Proxied requests answered 502: nothing listens on the port, or no agent tunnel.",
            p.bad_gateway.load(Ordering::Relaxed),
        );
    }

    fn write_connections(&self, e: &mut Exposition) {
        let c = &self.connections;
        e.single(
            "gpurent_http_connections",
            Kind::Gauge,
            "Connections open on the API listener.",
            c.open.load(Ordering::Relaxed),
        );
        let name = "gpurent_http_connections_refused_total";
        e.family(
            name,
            Kind::Counter,
            "Connections refused when accepted, over the cap per client address (per_ip) or in all (total).",
        );
        e.sample(
            name,
            &[("cap", "per_ip")],
            c.refused_per_ip.load(Ordering::Relaxed),
        );
        e.sample(
            name,
            &[("cap", "total")],
            c.refused_total.load(Ordering::Relaxed),
        );
        let name = "gpurent_http_slow_clients_closed_total";
        e.family(
            name,
            Kind::Counter,
            "Connections closed for being slow to send: a request header (header), a next request (idle) or a body (body) not in time.",
        );
        e.sample(
            name,
            &[("reason", "header")],
            c.closed_header.load(Ordering::Relaxed),
        );
        e.sample(
            name,
            &[("reason", "idle")],
            c.closed_idle.load(Ordering::Relaxed),
        );
        e.sample(
            name,
            &[("reason", "body")],
            c.closed_body.load(Ordering::Relaxed),
        );
    }

    fn write_events(&self, e: &mut Exposition) {
        let name = "gpurent_reservation_wait_seconds";
        e.family(
            name,
            Kind::Histogram,
            "Time from a reservation's request (or its requeue after a node loss) to its placement on GPUs, 0 when placed at once (placements by this control plane).",
        );
        let waits = self
            .waits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        waits.write(e, name, &[]);
        e.single(
            "gpurent_nodes_lost_total",
            Kind::Counter,
            "Nodes this control plane fenced as lost (not heard from for the node TTL).",
            self.nodes_lost.load(Ordering::Relaxed),
        );
        let name = "gpurent_failovers_total";
        e.family(
            name,
            Kind::Counter,
            "Reservations of lost nodes fenced by this control plane: queued again to run elsewhere (rescheduled) or ended (ended).",
        );
        e.sample(
            name,
            &[("outcome", "rescheduled")],
            self.rescheduled.load(Ordering::Relaxed),
        );
        e.sample(
            name,
            &[("outcome", "ended")],
            self.ended_by_loss.load(Ordering::Relaxed),
        );
    }
}

fn write_fleet(e: &mut Exposition, view: &MetricsView, now: DateTime<Utc>) {
    let name = "gpurent_gpus";
    e.family(
        name,
        Kind::Gauge,
        "GPUs of live nodes by type: free (no memory allocated) or allocated (whole, or any share of it).",
    );
    for (gpu_type, c) in &view.gpus {
        e.sample(name, &[("gpu_type", gpu_type), ("state", "free")], c.free);
        e.sample(
            name,
            &[("gpu_type", gpu_type), ("state", "allocated")],
            c.allocated,
        );
    }
    let name = "gpurent_gpu_memory_bytes";
    e.family(
        name,
        Kind::Gauge,
        "GPU memory of live nodes by GPU type: free, or allocated to reservations.",
    );
    for (gpu_type, c) in &view.gpus {
        let mib = |mb: u64| mb.saturating_mul(1024 * 1024);
        e.sample(
            name,
            &[("gpu_type", gpu_type), ("state", "free")],
            mib(c.free_mb),
        );
        e.sample(
            name,
            &[("gpu_type", gpu_type), ("state", "allocated")],
            mib(c.vram_mb.saturating_sub(c.free_mb)),
        );
    }
    let name = "gpurent_queue_length";
    e.family(
        name,
        Kind::Gauge,
        "Reservations queued for GPUs, by the GPU type they wait for.",
    );
    for (gpu_type, (n, _)) in &view.queued {
        e.sample(name, &[("gpu_type", gpu_type)], n);
    }
    let name = "gpurent_queue_oldest_wait_seconds";
    e.family(
        name,
        Kind::Gauge,
        "How long the reservation queued first has been waiting, by GPU type.",
    );
    for (gpu_type, (_, oldest)) in &view.queued {
        let waited = oldest.map_or(0, |t| (now - t).num_microseconds().unwrap_or(0).max(0));
        e.sample(name, &[("gpu_type", gpu_type)], micros(waited));
    }
    let name = "gpurent_nodes";
    e.family(
        name,
        Kind::Gauge,
        "Nodes by status, as `gpurent nodes ls` shows it.",
    );
    for status in NODE_STATUSES {
        let n = view.nodes.get(status).copied().unwrap_or(0);
        e.sample(name, &[("status", status)], n);
    }
    for (status, n) in view
        .nodes
        .iter()
        .filter(|(s, _)| !NODE_STATUSES.contains(&s.as_str()))
    {
        e.sample(name, &[("status", status)], n);
    }
    let name = "gpurent_reservations";
    e.family(
        name,
        Kind::Gauge,
        "Reservations by status and tier (ended ones included).",
    );
    for ((status, tier), n) in &view.reservations {
        e.sample(name, &[("status", status), ("tier", tier)], n);
    }
    e.single(
        "gpurent_preemptions_total",
        Kind::Counter,
        "Spot reservations preempted to make room for other work.",
        view.preempted,
    );
    let name = "gpurent_spot_instances_ended_total";
    e.family(
        name,
        Kind::Counter,
        "Spot instances that ran and ended: completed (their end or their tenant's stop) or interrupted by the platform (preempted, or stopped by their node).",
    );
    e.sample(name, &[("outcome", "completed")], view.spot.completed);
    e.sample(name, &[("outcome", "interrupted")], view.spot.interrupted);
    let name = "gpurent_spot_success_ratio";
    e.family(
        name,
        Kind::Gauge,
        "Completed spot instances over all that ended, since the start (GET /api/v1/admin/spot); no sample before the first ends.",
    );
    if let Some(rate) = view.spot.success_rate {
        e.sample(name, &[], rate);
    }
}

fn write_money(e: &mut Exposition, view: &MetricsView) {
    // Exact decimals of the integer micro-units: no float arithmetic on money.
    e.single(
        "gpurent_revenue_total",
        Kind::Counter,
        "Everything charged to tenants, in the platform's currency (gross, host shares included).",
        micros(view.charged.micros()),
    );
    e.single(
        "gpurent_host_earnings_total",
        Kind::Counter,
        "The part of the charges paid to the nodes' owners, in the platform's currency.",
        micros(view.host_earnings.micros()),
    );
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
        let text = m.render(&MetricsView::default(), Utc::now());
        let series = "route=\"/a/{id}\",method=\"GET\",status=\"2xx\"";
        assert!(text.contains(&format!(
            "gpurent_http_request_duration_seconds_bucket{{{series},le=\"0.005\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "gpurent_http_request_duration_seconds_bucket{{{series},le=\"0.05\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "gpurent_http_request_duration_seconds_sum{{{series}}} 0.043\n"
        )));
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
