//! What every handler shares: the store, the clock, the configuration and node wake-ups.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use gpurent_store::Store;
use gpurent_types::Clock;

use crate::jobs::elastic::ElasticState;
use crate::wake::NodeWakers;
use crate::ServerConfig;

/// Cloned for every extractor of every request: one reference count, not one per part.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

/// The parts of [`AppState`].
#[derive(Debug)]
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<ServerConfig>,
    /// The settings a reload (SIGHUP) may change; read them here, not in `config`.
    pub live: Arc<crate::reload::LiveConfig>,
    pub wake: Arc<NodeWakers>,
    pub elastic: Arc<ElasticState>,
    pub alerts: Arc<crate::jobs::alerts::AlertState>,
    /// When this replica last ran the budget pass.
    pub budget_pace: Arc<crate::budgets::pass::Pace>,
    /// Whether this replica is sending webhook deliveries.
    pub notify: crate::notifications::deliver::SharedNotify,
    /// When this replica last looked for the platform's events to tell webhooks.
    pub notify_scan: Arc<crate::notifications::events::Scan>,
    /// What `/metrics` counts in this process.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where each request's audit record goes; None when the trail is off.
    pub audit: Option<crate::audit::AuditTrail>,
    /// The token buckets of this process.
    pub rate_limits: Arc<crate::rate_limit::RateLimiters>,
    /// The tunnels agents hold open to this replica.
    pub tunnels: Arc<crate::tunnel::Tunnels>,
    /// The proxy's idle connections to instances' ports.
    pub upstreams: Arc<crate::proxy::pool::Upstreams>,
    /// The HTTP proxy's own state (when each reservation's use last counted).
    pub activity: Arc<crate::activity::Activity>,
    /// The sessions open into instances (SSH channels, web console terminals), capped per
    /// reservation.
    pub sessions: Arc<crate::ssh::Sessions>,
    /// This process's SSH endpoint, once it listens (never, without `--ssh-listen`).
    pub ssh_endpoint: Arc<std::sync::OnceLock<crate::ssh::SshEndpoint>>,
    /// The whole router, for the console's in-process API calls (set when it is built; it
    /// lives as long as the process serves it).
    pub console_api: Arc<std::sync::OnceLock<axum::Router>>,
    /// The admin pages' recent daily reports.
    pub console_reports: Arc<crate::console::report_cache::ReportCache>,
    /// The requests seen lately per GPU type: the workload placement keeps room for.
    pub expected: Arc<crate::expected::Expected>,
    /// The endpoints this control plane serves, their replicas and queues.
    pub endpoints: Arc<crate::endpoints::Endpoints>,
    /// This control plane among its replicas (random at each start): who holds an endpoint's
    /// scaling lease, whose load is whose.
    pub server_id: String,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, config: ServerConfig) -> Self {
        let audit = config.audit.enabled.then(|| {
            crate::audit::AuditTrail::start(Arc::clone(&store), Arc::clone(&clock), &config.audit)
        });
        let metrics: Arc<crate::metrics::Metrics> = Arc::default();
        let tunnels = Arc::new(crate::tunnel::Tunnels::new(
            Arc::clone(&store),
            Arc::clone(&clock),
            Arc::clone(&metrics),
        ));
        let sessions = crate::ssh::Sessions::new(Default::default(), Arc::clone(&metrics));
        AppState(Arc::new(Shared {
            audit,
            sessions,
            elastic: Arc::new(ElasticState::new(&config.scale)),
            alerts: Arc::default(),
            notify: Arc::default(),
            budget_pace: Arc::default(),
            notify_scan: Arc::default(),
            metrics,
            rate_limits: Arc::new(crate::rate_limit::RateLimiters::new(&config.rate_limits)),
            store,
            clock,
            live: Arc::new(crate::reload::LiveConfig::new(crate::reload::Live::of(
                &config,
            ))),
            config: Arc::new(config),
            wake: Arc::new(NodeWakers::default()),
            tunnels,
            upstreams: Arc::default(),
            activity: Arc::default(),
            ssh_endpoint: Arc::default(),
            console_api: Arc::default(),
            console_reports: Arc::default(),
            expected: Arc::default(),
            endpoints: Arc::default(),
            server_id: uuid::Uuid::new_v4().to_string(),
        }))
    }

    /// The prices, limits and rules in force now.
    pub fn live(&self) -> Arc<crate::reload::Live> {
        self.live.get()
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Nodes seen since this instant count as live.
    pub fn live_since(&self) -> DateTime<Utc> {
        let ttl =
            chrono::Duration::from_std(self.config.node_ttl()).unwrap_or(chrono::Duration::MAX);
        self.now() - ttl
    }
}
