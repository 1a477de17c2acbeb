//! The gpurent control plane: the HTTP API under `/api/v1`, the agent protocol, and the
//! background jobs (`jobs/`: the maintenance loop that expires reservations, places queued ones
//! and judges elastic capacity). Handlers are thin: they parse, authorize, call one store intent
//! and map the result.

mod activity;
mod arrays;
mod audit;
mod auth;
mod bootstrap;
mod budgets;
mod console;
mod endpoints;
mod error;
mod expected;
mod extract;
mod health_rules;
mod idempotency;
mod jobs;
mod metrics;
mod notifications;
mod openapi;
mod pagination;
mod password;
mod policy;
mod proxy;
mod quotas;
mod rate_limit;
mod reauth;
mod registries;
pub mod reload;
mod report;
mod routes;
pub mod secrets;
mod serve;
pub mod shared_keys;
pub mod ssh;
pub mod ssh_keys;
mod state;
mod teams;
mod templates;
pub mod tls;
pub mod tunnel;
mod validate;
mod verification;
mod volumes;
mod wake;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gpurent_billing::PriceList;
use gpurent_store::{Backend, Store};
use gpurent_types::Clock;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use audit::AuditConfig;
pub use auth::{hash_token, new_token};
pub use bootstrap::{bootstrap_admin, BootstrapError};
pub use error::ApiError;
pub use gpurent_store::TenantLimits;
pub use health_rules::HealthRules;
pub use idempotency::IdempotencyError;
pub use jobs::elastic::{ScaleConfig, ScaleEvent};
pub use jobs::JobError;
pub use openapi::openapi_document;
pub use policy::{Access, POLICY};
pub use proxy::host::DEFAULT_APPS_DOMAIN;
pub use rate_limit::{Rate, RateLimits};
pub use report::plot as report_plot;
pub use serve::{open_files_limit, raise_open_files_limit, HttpLimits, OpenFiles};
pub use state::AppState;
pub use verification::HostPolicy;

/// How the control plane behaves; the defaults suit production.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub prices: PriceList,
    /// How often agents are expected to sync (their heartbeat; `gpurent agent --heartbeat-ms`).
    pub heartbeat_interval: Duration,
    /// A node that missed this many heartbeats in a row (the node TTL, `node_ttl()`) gets no
    /// new reservations and is fenced by the maintenance loop: `lost`, its work billed up to
    /// the fence time and rescheduled elsewhere (or ended, as each reservation chose).
    pub missed_heartbeats: u32,
    /// How often reservations are checked for expiry and settlement, and the queue for what
    /// can be placed (also done at once when capacity is freed).
    pub maintenance_interval: Duration,
    /// Running reservations are charged this often (and stopped when the tenant cannot pay
    /// for the next period).
    pub settlement_period: Duration,
    /// The longest an agent's sync may be held waiting for new desired state.
    pub max_sync_wait: Duration,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// How long a client may be slow to send, and how many connections it may hold.
    pub http: HttpLimits,
    /// A reservation still queued this long after it was queued ends as `failed`
    /// (`queue_timeout`), its hold released.
    pub queue_timeout: Duration,
    /// A reservation's output is kept this long after it ended, then pruned by the
    /// maintenance loop (`--log-retention-days`, 30).
    pub log_retention: Duration,
    /// A tenant whose balance is below zero keeps their volumes this long; then an admin may
    /// delete them (`--storage-grace-days`, 7).
    pub storage_grace: Duration,
    /// Elastic capacity: the scale policy and its hook (off unless a hook is configured).
    pub scale: ScaleConfig,
    /// What a node's host must pass before it gets work.
    pub host_policy: HostPolicy,
    /// What a node's GPUs must keep passing to get work.
    pub health_rules: HealthRules,
    /// Running reservations whose GPUs have been idle this long are stopped (end reason
    /// `idle`), unless they opted out; `None`: never.
    pub idle_reclaim: Option<Duration>,
    /// Every event is POSTed here as JSON (`--alert-webhook`).
    pub alert_webhook: Option<String>,
    /// Tenants' webhooks (`gpurent notifications`).
    pub notifications: NotifyConfig,
    /// Fair share between the tenants in the queue: how fast their past use is forgotten
    /// (`--fairshare-half-life`, 7 days).
    pub fair_share_half_life: Duration,
    /// The audit trail of every API request.
    pub audit: AuditConfig,
    /// How long a login's session token is valid (`--session-hours`, 12).
    pub session_ttl: Duration,
    /// Requests per token and per client address (`rate_limit.rs`).
    pub rate_limits: RateLimits,
    /// Caps on each tenant's live reservations and their spend per hour, unless the tenant
    /// has its own (`--max-reservations-per-tenant`, `--max-spend-per-hour`).
    pub tenant_limits: TenantLimits,
    /// TLS 1.3 on the listener and mutual TLS for agents; `None`: plain HTTP (loopback).
    pub tls: Option<tls::TlsConfig>,
    /// Seals tenants' secrets at rest (`--master-key-file`, `GPURENT_MASTER_KEY`).
    pub master_key: secrets::MasterKey,
    /// Where other replicas reach this one, to relay SSH channels to agents connected here
    /// (`--advertise-url`); `None`: the listen address when it is a specific one. Only on
    /// PostgreSQL, where there can be other replicas.
    pub advertise_url: Option<String>,
    /// The apps' site (`--apps-domain`): browsers reach each published HTTP port at
    /// `ID-PORT.DOMAIN`, a site that shares no cookie with the console's. `localhost` (the
    /// default) on one machine; beyond it, a registrable domain other than the console's,
    /// with a wildcard DNS name and certificate for `*.DOMAIN`.
    pub apps_domain: String,
}

/// Where tenants' webhooks may point and how long a delivery waits for its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyConfig {
    /// Webhooks may point at private addresses (loopback, RFC 1918, link-local): a
    /// control plane whose tenants' receivers are on its own network
    /// (`--notifications-allow-private`). Off: a tenant cannot make it call into its network.
    pub allow_private: bool,
    /// How long an attempt waits to connect and for the answer.
    pub timeout: Duration,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            allow_private: false,
            timeout: Duration::from_secs(10),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            prices: PriceList::defaults(),
            heartbeat_interval: Duration::from_secs(2),
            missed_heartbeats: 3,
            maintenance_interval: Duration::from_secs(1),
            settlement_period: Duration::from_secs(60),
            max_sync_wait: Duration::from_secs(10),
            max_body_bytes: 64 * 1024,
            http: HttpLimits::default(),
            queue_timeout: Duration::from_secs(3600),
            log_retention: Duration::from_secs(30 * 86_400),
            storage_grace: Duration::from_secs(7 * 86_400),
            scale: ScaleConfig::default(),
            host_policy: HostPolicy::default(),
            health_rules: HealthRules::default(),
            idle_reclaim: Some(Duration::from_secs(5 * 60)),
            alert_webhook: None,
            notifications: NotifyConfig::default(),
            fair_share_half_life: Duration::from_secs(7 * 86_400),
            audit: AuditConfig::default(),
            session_ttl: Duration::from_secs(12 * 3600),
            rate_limits: RateLimits::default(),
            tenant_limits: TenantLimits::default(),
            tls: None,
            master_key: Arc::new(secrets::LocalKey::from_bytes(&rand::random())),
            advertise_url: None,
            apps_domain: proxy::host::DEFAULT_APPS_DOMAIN.to_owned(),
        }
    }
}

impl ServerConfig {
    /// No rate limits and no per-tenant caps: the benchmarks, which load one tenant hard.
    pub fn without_limits(self) -> Self {
        ServerConfig {
            rate_limits: RateLimits {
                per_token: None,
                per_address: None,
            },
            tenant_limits: TenantLimits::UNLIMITED,
            ..self
        }
    }

    /// How long a node may go unheard before it is `lost`: heartbeat interval x missed beats.
    pub fn node_ttl(&self) -> Duration {
        self.heartbeat_interval
            .saturating_mul(self.missed_heartbeats.max(1))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
    #[error("cannot set up TLS")]
    Tls(#[from] tls::TlsError),
    #[error("cannot set up the client of streams relayed to other replicas: {0}")]
    Relay(String),
}

/// Where other replicas reach this one: `--advertise-url`, else the bound address when it
/// is a specific one; none on SQLite (one replica only).
fn advertise_url(state: &AppState, addr: SocketAddr) -> Option<String> {
    if state.store.backend() != Backend::Postgres {
        return None;
    }
    if let Some(url) = &state.config.advertise_url {
        return Some(url.clone());
    }
    if addr.ip().is_unspecified() {
        tracing::warn!(%addr, "listening on every address: give --advertise-url for other replicas to relay SSH channels to agents connected here");
        return None;
    }
    let scheme = if state.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    Some(format!("{scheme}://{addr}"))
}

/// The client of streams relayed to other replicas. Over TLS it trusts this replica's own
/// certificate (replicas behind one load balancer serve the same one).
fn relay_client(config: &ServerConfig) -> Result<reqwest::Client, ServeError> {
    let mut builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
    if let Some(tls) = &config.tls {
        let certs = gpurent_types::keyfile::load_certs(&tls.cert)
            .map_err(|e| ServeError::Relay(e.to_string()))?;
        for der in certs {
            let cert = reqwest::Certificate::from_der(der.as_ref())
                .map_err(|e| ServeError::Relay(e.to_string()))?;
            builder = builder.add_root_certificate(cert);
        }
    }
    builder
        .build()
        .map_err(|e| ServeError::Relay(e.to_string()))
}

/// A control plane serving on a bound socket until [`RunningServer::shutdown`].
#[derive(Debug)]
pub struct RunningServer {
    pub addr: SocketAddr,
    pub state: AppState,
    stop: watch::Sender<bool>,
    http: JoinHandle<()>,
    maintenance: JoinHandle<()>,
    /// On PostgreSQL, the watch of other replicas' changes (`jobs/versions.rs`).
    versions: Option<JoinHandle<()>>,
    /// The served certificate, read again by a reload.
    tls_resolver: Option<Arc<tls::ReloadingResolver>>,
}

/// What a reload changed.
#[derive(Debug)]
pub struct Reloaded {
    /// The settings that differ from before, by name.
    pub changed: Vec<&'static str>,
    /// Under TLS: the served certificate's fingerprint, or why the files did not load (the
    /// old certificate stays).
    pub tls: Option<Result<String, String>>,
}

impl RunningServer {
    /// Starts serving on `listen` (port 0 picks a free one) and the maintenance loop.
    pub async fn start(
        listen: SocketAddr,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: ServerConfig,
    ) -> Result<RunningServer, ServeError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: listen,
            source,
        })?;
        let state = AppState::new(store, clock, config);
        let router = routes::router(state.clone());
        let (stop, stopped) = watch::channel(false);
        let mut tls_resolver = None;
        let tls = match &state.config.tls {
            None => None,
            Some(settings) => {
                let resolver = tls::ReloadingResolver::load(&settings.cert, &settings.key)?;
                tracing::info!(fingerprint = %resolver.fingerprint(), "TLS 1.3 on, mutual TLS for agents");
                let config = tls::server_config(resolver.clone(), &settings.node_ca)?;
                tls_resolver = Some(Arc::clone(&resolver));
                tokio::spawn(resolver.watch(
                    settings.cert.clone(),
                    settings.key.clone(),
                    settings.reload_every,
                    stopped.clone(),
                ));
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
            }
        };
        let http = tokio::spawn(serve::serve(
            listener,
            tls,
            router,
            state.config.http,
            state.metrics.clone(),
            state.config.apps_domain.clone(),
            stopped.clone(),
        ));
        if let Some(url) = advertise_url(&state, addr) {
            state.tunnels.advertise(url, relay_client(&state.config)?);
        }
        let versions = (state.store.backend() == Backend::Postgres)
            .then(|| tokio::spawn(jobs::versions::run(state.clone(), stopped.clone())));
        tokio::spawn(endpoints::scaler::run(state.clone(), stopped.clone()));
        let maintenance = tokio::spawn(jobs::maintenance::run(state.clone(), stopped));
        tracing::info!(%addr, backend = ?state.store.backend(), "control plane listening");
        let scale = &state.config.scale;
        if scale.enabled() {
            tracing::info!(
                interval = ?scale.interval,
                hook_command = ?scale.hook_command,
                hook_url = ?scale.hook_url,
                "elastic capacity on"
            );
        }
        Ok(RunningServer {
            addr,
            state,
            stop,
            http,
            maintenance,
            versions,
            tls_resolver,
        })
    }

    /// Puts `live` in force (SIGHUP) and reads the TLS certificate's files again now. Says
    /// what changed; refused whole when the currency would change.
    pub fn reload(&self, live: reload::Live) -> Result<Reloaded, reload::ReloadError> {
        let rates = live.rate_limits;
        let changed = self.state.live.replace(live)?;
        self.state.rate_limits.set(&rates);
        let tls = match (&self.tls_resolver, &self.state.config.tls) {
            (Some(resolver), Some(settings)) => {
                Some(resolver.reload(&settings.cert, &settings.key).map_err(|e| {
                    let mut message = e.to_string();
                    let mut source = std::error::Error::source(&e);
                    while let Some(cause) = source {
                        message.push_str(&format!(": {cause}"));
                        source = cause.source();
                    }
                    message
                }))
            }
            _ => None,
        };
        Ok(Reloaded { changed, tls })
    }

    /// Runs one maintenance pass now (tests call this after moving the clock).
    pub async fn maintenance_tick(&self) -> Result<(), JobError> {
        jobs::maintenance::tick(&self.state).await
    }

    /// Runs one scheduling pass now (the arrays' and the queue's), as freed capacity does
    /// (`gpurent bench array` times it).
    pub async fn scheduling_pass(&self) -> Result<(), JobError> {
        jobs::scheduler::pass(&self.state).await
    }

    /// Stops accepting requests, lets running ones finish, and stops the maintenance loop.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let _ = self.stop.send(true);
        self.state.wake.wake_all();
        let _ = self.maintenance.await;
        if let Some(versions) = self.versions {
            let _ = versions.await;
        }
        self.http
            .await
            .map_err(|e| ServeError::Serve(std::io::Error::other(e)))
    }

    /// Resolves when the HTTP server stops by itself (it should not).
    pub async fn wait(&mut self) -> Result<(), ServeError> {
        (&mut self.http)
            .await
            .map_err(|e| ServeError::Serve(std::io::Error::other(e)))
    }
}
