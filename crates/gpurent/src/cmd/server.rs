//! `gpurent server`: the control plane alone, on SQLite or PostgreSQL.

use std::sync::Arc;

use anyhow::Context;
use gpurent_audit::Signer;
use gpurent_billing::PriceList;
use gpurent_server::ssh::{SshError, SshLimits, SshServer};
use gpurent_server::{
    bootstrap_admin, AuditConfig, HealthRules, HostPolicy, Rate, RateLimits, RunningServer,
    ScaleConfig, ServerConfig, TenantLimits,
};
use gpurent_store::SqlStore;
use gpurent_types::SystemClock;

use super::lock::DataDirLock;
use crate::cli::{HostArgs, KeysArgs, LivenessArgs, ScaleArgs, ServerArgs};
use crate::output::print_line;

pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    super::private::server_data_dir(&args.data_dir)?;
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", args.data_dir.join("gpurent.db").display()));
    // Replicas share a PostgreSQL database; a SQLite data dir has one control plane.
    let mut lock = url
        .starts_with("sqlite://")
        .then(|| DataDirLock::acquire(&args.data_dir))
        .transpose()?;
    let master_key = super::server::master_key(&args.keys, &args.data_dir)?;
    let store = open_store(&url).await?;
    let tls = super::tls::server_tls(&args.tls, &args.data_dir, args.listen, &*master_key, &store)
        .await?;
    let server = start(
        store,
        &args.data_dir,
        args.listen,
        args.prices.as_deref(),
        std::time::Duration::from_secs(args.queue_timeout),
        Policies {
            scale: scale_config(&args.scale),
            host: &args.host,
            access: &args.access,
            http: &args.http,
            liveness: &args.liveness,
            keys: &args.keys,
            master_key,
            tls,
        },
    )
    .await?;
    let ssh = start_ssh(
        args.ssh_listen,
        args.ssh_advertise.clone(),
        false,
        &args.data_dir,
        &server,
    )
    .await?;
    let base = super::local_url(server.addr, server.state.config.tls.is_some());
    match &mut lock {
        Some(lock) => lock.serving(&base)?,
        None => super::lock::write_server_url(&args.data_dir, &base)?,
    }
    print_line(&format!("gpurent ready: {base}"));
    super::console_hint(&base);
    super::reload::until_stopped(&server, crate::cli::Daemon::Server).await?;
    super::lock::remove_server_url(&args.data_dir);
    stop_ssh(ssh, &args.data_dir).await;
    let store = server.state.store.clone();
    server.shutdown().await.context("the HTTP server failed")?;
    drop(store);
    Ok(())
}

/// The file in the data dir that holds the SSH endpoint's bound address while it serves (for
/// scripts and tests that ask for port 0).
pub const SSH_ADDR_FILE: &str = "ssh.addr";

/// Starts the SSH endpoint at `listen` (none when `off`), and tells the API where clients
/// reach it (`advertise`, else the listen port). With `warn_if_taken` (the default address
/// of `up`), a taken port is a warning, not a failure: a second `up` on one machine still
/// runs, without SSH.
pub async fn start_ssh(
    listen: crate::cli::SshListen,
    advertise: Option<gpurent_server::ssh::Advertise>,
    warn_if_taken: bool,
    data_dir: &std::path::Path,
    server: &RunningServer,
) -> anyhow::Result<Option<SshServer>> {
    let Some(addr) = listen.0 else {
        if advertise.is_some() {
            anyhow::bail!("--ssh-advertise needs an SSH endpoint: give --ssh-listen HOST:PORT too");
        }
        return Ok(None);
    };
    let started =
        SshServer::start(addr, data_dir, server.state.clone(), SshLimits::default()).await;
    let ssh = match started {
        Ok(ssh) => ssh,
        Err(SshError::Bind { source, .. })
            if warn_if_taken && source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            tracing::warn!(
                %addr,
                "the SSH port is taken (another gpurent up?); running without SSH: give \
                 --ssh-listen HOST:PORT for another one, or --ssh-listen off"
            );
            return Ok(None);
        }
        Err(e) => return Err(e).context("cannot start the SSH endpoint (--ssh-listen)"),
    };
    let file = data_dir.join(SSH_ADDR_FILE);
    std::fs::write(&file, format!("{}\n", ssh.addr))
        .with_context(|| format!("cannot write {}", file.display()))?;
    eprintln!("gpurent ssh: {}", ssh.addr);
    // Set once per process: a second start (there is none) would keep the first.
    let _ = server.state.ssh_endpoint.set(ssh.endpoint(advertise));
    Ok(Some(ssh))
}

/// Stops the SSH endpoint and removes its address file.
pub async fn stop_ssh(ssh: Option<SshServer>, data_dir: &std::path::Path) {
    if let Some(ssh) = ssh {
        let _ = std::fs::remove_file(data_dir.join(SSH_ADDR_FILE));
        ssh.shutdown().await;
    }
}

/// What the control plane is told to do besides serving: scale, admit and watch nodes.
pub struct Policies<'a> {
    pub scale: ScaleConfig,
    pub host: &'a HostArgs,
    pub access: &'a crate::cli::AccessArgs,
    pub http: &'a crate::cli::HttpArgs,
    pub liveness: &'a LivenessArgs,
    pub keys: &'a KeysArgs,
    /// Seals tenants' secrets and the keys every replica shares.
    pub master_key: gpurent_server::secrets::MasterKey,
    /// TLS on the listener; `None`: plain HTTP.
    pub tls: Option<gpurent_server::tls::TlsConfig>,
}

/// Opens the store at `database_url` (a SQLite file made private first), migrated.
pub async fn open_store(database_url: &str) -> anyhow::Result<SqlStore> {
    super::private::sqlite_database(database_url)?;
    SqlStore::connect(database_url)
        .await
        .with_context(|| format!("cannot open the store at {}", redact(database_url)))
}

/// Bootstraps the admin and starts serving on `store`.
pub async fn start(
    store: SqlStore,
    data_dir: &std::path::Path,
    listen: std::net::SocketAddr,
    prices: Option<&std::path::Path>,
    queue_timeout: std::time::Duration,
    policies: Policies<'_>,
) -> anyhow::Result<RunningServer> {
    let Policies {
        scale,
        host,
        access,
        http,
        liveness,
        keys,
        master_key,
        tls,
    } = policies;
    // Every connection is a file descriptor: take what the system allows, so that the
    // connection cap (below the limit) is the one that refuses, never accept().
    match gpurent_server::raise_open_files_limit() {
        Ok(files) => tracing::debug!(soft = files.soft, hard = files.hard, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-files limit"),
    }
    let live = super::reload::live(prices, host, access)?;
    let apps_domain = apps_domain(http.apps_domain.as_deref())?;
    if apps_domain == gpurent_server::DEFAULT_APPS_DOMAIN && !listen.ip().is_loopback() {
        tracing::warn!(
            %listen,
            "published ports are served to browsers at ID-PORT.localhost, which only a browser \
             on this machine reaches: give --apps-domain (a wildcard DNS name of a registrable \
             domain other than the console's) for browsers elsewhere"
        );
    }
    let clock = Arc::new(SystemClock);
    let audit = audit_config(keys, data_dir, &store, &*master_key).await?;
    if let Some(path) = bootstrap_admin(&store, &*clock, data_dir).await? {
        tracing::info!("admin token written to {}", path.display());
    }
    let server = RunningServer::start(
        listen,
        Arc::new(store),
        clock,
        ServerConfig {
            prices: live.prices,
            queue_timeout,
            scale,
            host_policy: live.host_policy,
            alert_webhook: live.alert_webhook,
            fair_share_half_life: host.fairshare_half_life,
            notifications: gpurent_server::NotifyConfig {
                allow_private: host.notifications_allow_private,
                ..gpurent_server::NotifyConfig::default()
            },
            idle_reclaim: live.idle_reclaim,
            health_rules: live.health_rules,
            heartbeat_interval: liveness.heartbeat(),
            missed_heartbeats: liveness.missed_heartbeats.max(1),
            audit,
            log_retention: std::time::Duration::from_secs(
                u64::from(keys.log_retention_days) * 86_400,
            ),
            storage_grace: std::time::Duration::from_secs(
                u64::from(keys.storage_grace_days) * 86_400,
            ),
            master_key,
            session_ttl: std::time::Duration::from_secs(u64::from(access.session_hours) * 3600),
            rate_limits: live.rate_limits,
            tenant_limits: live.tenant_limits,
            http: http.limits(),
            advertise_url: http.advertise_url.clone(),
            apps_domain,
            tls,
            ..ServerConfig::default()
        },
    )
    .await?;
    Ok(server)
}

/// The price file's prices (its incoherences said on stderr and in the log), or the
/// built-in ones.
pub fn load_prices(path: Option<&std::path::Path>) -> anyhow::Result<PriceList> {
    let Some(path) = path else {
        return Ok(PriceList::defaults());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the price file {}", path.display()))?;
    let prices = PriceList::from_toml(&text)
        .with_context(|| format!("in the price file {}", path.display()))?;
    // Said on stderr as well as in the log: `up` and `server` start anyway, with the owner's
    // prices as written.
    for incoherence in prices.incoherences() {
        eprintln!("warning: the price file {}: {incoherence}", path.display());
        tracing::warn!(file = %path.display(), "{incoherence}");
    }
    Ok(prices)
}

/// The master key that seals tenants' secrets: `GPURENT_MASTER_KEY` (hex), else the file
/// (`--master-key-file`, default DATA_DIR/master.key, made on first start, mode 0600).
pub fn master_key(
    args: &KeysArgs,
    data_dir: &std::path::Path,
) -> anyhow::Result<gpurent_server::secrets::MasterKey> {
    use gpurent_server::secrets::LocalKey;
    if let Ok(hex) = std::env::var("GPURENT_MASTER_KEY") {
        let key = LocalKey::from_hex(&hex).context("GPURENT_MASTER_KEY")?;
        return Ok(Arc::new(key));
    }
    let path = args
        .master_key_file
        .clone()
        .unwrap_or_else(|| data_dir.join("master.key"));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && args.master_key_file.is_none() => {
            let text = LocalKey::generate_hex();
            super::write_secret(&path, &text)
                .with_context(|| format!("cannot write the master key to {}", path.display()))?;
            tracing::info!(path = %path.display(), "made the master key that seals secrets; back it up: without it they cannot be opened");
            text
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read the master key {}", path.display()))
        }
    };
    if args.master_key_file.is_some() {
        super::private::warn_if_open(&path);
    }
    let key = LocalKey::from_hex(&text)
        .with_context(|| format!("the master key in {}", path.display()))?;
    Ok(Arc::new(key))
}

/// The audit trail's settings, with its signing key: the one every replica shares, sealed in
/// the database (made on first start). A key in `--audit-key FILE` (default DATA_DIR/audit.key,
/// where older versions kept it) that the database lacks is imported; one that is not the
/// database's is refused.
async fn audit_config(
    args: &KeysArgs,
    data_dir: &std::path::Path,
    store: &SqlStore,
    master_key: &dyn gpurent_server::secrets::KeyProvider,
) -> anyhow::Result<AuditConfig> {
    use gpurent_server::shared_keys::{self, Found, AUDIT_KEY};
    let path = args
        .audit_key
        .clone()
        .unwrap_or_else(|| data_dir.join("audit.key"));
    if args.audit_key.is_some() {
        super::private::warn_if_open(&path);
    }
    let found = match shared_keys::read_if_there(&path) {
        Ok(Some(text)) => {
            let seed = Signer::from_seed_hex(&String::from_utf8_lossy(&text))
                .with_context(|| format!("the audit key in {}", path.display()))?
                .seed_hex();
            Some(Found {
                path: path.clone(),
                value: seed.into_bytes(),
            })
        }
        Ok(None) if args.audit_key.is_some() => {
            anyhow::bail!(
                "the audit key {} (--audit-key) does not exist; leave the flag out to use \
                 the one in the database (made on first start)",
                path.display()
            )
        }
        Ok(None) => None,
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read the audit key {}", path.display()))
        }
    };
    let public = |seed: &[u8]| {
        Signer::from_seed_hex(&String::from_utf8_lossy(seed))
            .map(|signer| format!("public key {}", signer.public_key()))
            .map_err(|e| e.to_string())
    };
    let make = || Ok(Signer::from_seed(rand::random()).seed_hex().into_bytes());
    let loaded = shared_keys::load_or_store(
        store,
        master_key,
        AUDIT_KEY,
        found,
        public,
        make,
        chrono::Utc::now(),
    )
    .await
    .context("cannot load the audit signing key")?;
    let signer = Signer::from_seed_hex(&String::from_utf8_lossy(&loaded.value))
        .context("the audit key in the database")?;
    tracing::info!(public_key = %signer.public_key(), "audit checkpoints are signed with this key");
    Ok(AuditConfig {
        enabled: true,
        signer: Arc::new(signer),
        retention: std::time::Duration::from_secs(u64::from(args.audit_retention_days) * 86_400),
        ..AuditConfig::default()
    })
}

/// The host verification rules of `up` and `server`.
pub fn host_policy(args: &HostArgs) -> HostPolicy {
    HostPolicy {
        min_driver: args.min_driver.clone(),
        min_cuda: args.min_cuda.clone(),
        min_disk_free_gb: args.min_disk_free_gb,
    }
}

/// The GPU health thresholds of `up` and `server`.
pub fn health_rules(args: &HostArgs) -> HealthRules {
    HealthRules {
        max_temperature_c: args.max_gpu_temp,
        max_vram_pct: args.max_vram_pct,
        ..HealthRules::default()
    }
}

/// The elastic capacity settings of `up` and `server`.
pub fn scale_config(args: &ScaleArgs) -> ScaleConfig {
    let defaults = ScaleConfig::default();
    ScaleConfig {
        hook_command: args.scale_hook_command.clone(),
        hook_url: args.scale_hook_url.clone(),
        interval: std::time::Duration::from_secs(args.scale_interval.max(1)),
        policy: gpurent_sched::elastic::ElasticConfig {
            min_nodes: args.scale_min_nodes,
            ..defaults.policy
        },
        ..defaults
    }
}

/// A database URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// `--rate-limit-per-token` and `--rate-limit-per-address`: N a second, bursts of 2N.
pub fn rate_limits(access: &crate::cli::AccessArgs) -> RateLimits {
    let rate = |n: u32| {
        (n > 0).then(|| Rate {
            per_second: f64::from(n),
            burst: n.saturating_mul(2),
        })
    };
    RateLimits {
        per_token: rate(access.rate_limit_per_token),
        per_address: rate(access.rate_limit_per_address),
    }
}

/// `--max-reservations-per-tenant` (0: none) and `--max-spend-per-hour`.
pub fn tenant_limits(access: &crate::cli::AccessArgs) -> TenantLimits {
    TenantLimits {
        max_reservations: match access.max_reservations_per_tenant {
            0 => u32::MAX,
            n => n,
        },
        max_spend_per_hour: access.max_spend_per_hour,
    }
}

/// `--apps-domain`: a DNS name (`apps.example.net`), lowercased, without dots at its ends;
/// `localhost` when none is given.
fn apps_domain(domain: Option<&str>) -> anyhow::Result<String> {
    let Some(domain) = domain else {
        return Ok(gpurent_server::DEFAULT_APPS_DOMAIN.to_owned());
    };
    let domain = domain.trim_matches('.').to_ascii_lowercase();
    let valid = !domain.is_empty()
        && domain.len() <= 200
        && domain.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    if !valid {
        anyhow::bail!(
            "--apps-domain {domain:?} is not a DNS name (give the parent of the wildcard, \
             e.g. apps.example.net for *.apps.example.net)"
        );
    }
    Ok(domain)
}
