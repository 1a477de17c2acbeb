//! `gpurent up`: the control plane on an embedded SQLite file plus one local node agent.

use std::time::Duration;

use anyhow::{bail, Context};
use gpurent_agent::tls::ClientTls;
use gpurent_agent::{Agent, AgentConfig, NodeIdentity};
use gpurent_server::{hash_token, new_token};
use gpurent_types::Role;
use tokio::sync::watch;

use super::lock::DataDirLock;
use crate::cli::UpArgs;
use crate::output::print_line;

/// How long `up` waits for its local agent to report in before giving up.
const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn run(mut args: UpArgs, client_tls: ClientTls) -> anyhow::Result<()> {
    args.data_dir = super::agent::absolute(&args.data_dir)?;
    super::agent::absolute_node_paths(&mut args.node)?;
    super::private::server_data_dir(&args.data_dir)?;
    let agent_dir = args.data_dir.join("agent");
    super::private::agent_data_dir(&agent_dir)?;
    let mut lock = DataDirLock::acquire(&args.data_dir)?;
    super::prereqs::install_missing(&args.node, args.no_install);
    let master_key = super::server::master_key(&args.keys, &args.data_dir)?;
    let url = format!("sqlite://{}", args.data_dir.join("gpurent.db").display());
    let store = super::server::open_store(&url).await?;
    let tls = super::tls::server_tls(&args.tls, &args.data_dir, args.listen, &*master_key, &store)
        .await?;
    // The local agent trusts what the CLI flags say, else the certificate served at start.
    let agent_tls = match &tls {
        Some(settings) if client_tls.ca_cert.is_none() && client_tls.fingerprint.is_none() => {
            ClientTls {
                fingerprint: Some(
                    gpurent_server::tls::ReloadingResolver::load(&settings.cert, &settings.key)?
                        .fingerprint(),
                ),
                ..client_tls
            }
        }
        _ => client_tls,
    };
    let server = super::server::start(
        store,
        &args.data_dir,
        args.listen,
        args.prices.as_deref(),
        Duration::from_secs(args.queue_timeout),
        super::server::Policies {
            scale: super::server::scale_config(&args.scale),
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
    let ssh = super::server::start_ssh(
        args.ssh_listen,
        args.ssh_advertise.clone(),
        args.ssh_listen.0 == crate::cli::DEFAULT_SSH_LISTEN.parse().ok(),
        &args.data_dir,
        &server,
    )
    .await?;
    let base = super::local_url(server.addr, server.state.config.tls.is_some());
    let store = server.state.store.clone();

    let name = super::agent::host_name();
    // The control plane's data dir (admin token, master key, database) holds the agent's.
    let volumes = super::agent::volume_store(&args.node, &agent_dir)?;
    let (gpus, executor) = super::agent::backends(
        &args.node,
        &name,
        &agent_dir,
        &[&args.data_dir],
        true,
        &volumes,
    )
    .await?;
    let mut config = AgentConfig::new(&base, agent_dir.clone(), &name);
    config.tls = agent_tls;
    super::agent::configure_node(&mut config, &args.liveness, &args.node, volumes);
    if NodeIdentity::load(&agent_dir)?.is_none() {
        // The local agent joins like any other: with a join token, over HTTP.
        let admin = store
            .list_users(1000, None)
            .await?
            .into_iter()
            .find(|u| u.role == Role::Admin)
            .context("the store has no admin user")?;
        let token = new_token("gpj");
        let now = server.state.now();
        store
            .create_join_token(
                &hash_token(&token),
                &admin.id,
                now + chrono::Duration::hours(1),
                now,
            )
            .await?;
        config.join_token = Some(token);
    }
    let (stop, stopped) = watch::channel(false);
    let network = if executor.shared_network() {
        "instances' network: shared (they reach this machine's loopback services and each other's ports)"
    } else {
        "instances' network: their own (the node's loopback and other instances out of reach)"
    };
    let agent = Agent::new(config, gpus, executor);
    if let Some(listen) = args.agent_metrics_listen {
        gpurent_agent::metrics::serve(listen, agent.metrics(), stopped.clone()).await?;
    }
    let mut agent = tokio::spawn(agent.run(stopped));

    let deadline = tokio::time::Instant::now() + AGENT_READY_TIMEOUT;
    loop {
        let nodes = store.list_nodes(server.state.live_since(), None).await?;
        let node = nodes.iter().find(|n| n.name == name);
        if node.is_some_and(|n| n.status == "ready") {
            break;
        }
        if agent.is_finished() || tokio::time::Instant::now() > deadline {
            let _ = stop.send(true);
            let outcome = (&mut agent).await;
            super::server::stop_ssh(ssh, &args.data_dir).await;
            server.shutdown().await.ok();
            match outcome {
                Ok(Err(e)) => return Err(e).context("the local agent failed"),
                // It reported in, but may not take work: say why, and how to change it.
                _ if node.is_some_and(|n| n.status == "unverified") => bail!(
                    "the local node failed host verification: {} (the checks are options of \
                     `up`: --min-disk-free-gb, --min-driver, --min-cuda)",
                    failed_checks(node)
                ),
                _ if node.is_some() => bail!(
                    "the local node is {} after {AGENT_READY_TIMEOUT:?}, not ready: {}",
                    node.map_or("", |n| n.status.as_str()),
                    node.map(|n| {
                        n.health
                            .iter()
                            .map(|h| format!("{} {}: {}", h.gpu_uuid, h.rule, h.detail))
                            .collect::<Vec<_>>()
                            .join("; ")
                    })
                    .unwrap_or_default()
                ),
                _ => bail!("the local agent did not report in within {AGENT_READY_TIMEOUT:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    lock.serving(&base)?;
    print_line(&format!("gpurent ready: {base}"));
    print_line(network);
    super::console_hint(&base);

    let agent_failed = tokio::select! {
        r = super::reload::until_stopped(&server, crate::cli::Daemon::Up) => { r?; None }
        r = &mut agent => Some(r),
    };
    super::lock::remove_server_url(&args.data_dir);
    let _ = stop.send(true);
    let agent_result = match agent_failed {
        Some(r) => r,
        None => agent.await,
    };
    super::server::stop_ssh(ssh, &args.data_dir).await;
    server.shutdown().await.context("the HTTP server failed")?;
    agent_result
        .context("the agent task failed")?
        .context("the local agent failed")?;
    Ok(())
}

/// The host checks a node failed, as "disk: 9 GiB free, under 10 GiB; ...".
fn failed_checks(node: Option<&gpurent_types::api::Node>) -> String {
    node.and_then(|n| n.verification.as_ref())
        .map(|v| {
            v.checks
                .iter()
                .filter(|c| !c.ok)
                .map(|c| format!("{}: {}", c.name, c.detail))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}
