//! Nodes: ls, the join token, cordon, drain, uncordon, revoke, and their events.

use gpurent_types::api::{Event, JoinToken, Node, NodeRevoked, NodeScheduled};

use super::segment;
use crate::api_client::{ApiClient, CliError};
use crate::output::{print_json, print_json_line, print_line, print_table};

/// `gpurent nodes join-token`.
pub(super) async fn join_token(api: &ApiClient, json: bool) -> Result<(), CliError> {
    let t: JoinToken = api
        .post("/api/v1/nodes/join-token", &serde_json::json!({}), None)
        .await?;
    if json {
        return print_json(&t);
    }
    print_line(&t.token);

    Ok(())
}

/// `gpurent nodes revoke`.
pub(super) async fn revoke(api: &ApiClient, node: String, json: bool) -> Result<(), CliError> {
    let done: NodeRevoked = api
        .post(
            &format!("/api/v1/nodes/{}/revoke", segment(&node)),
            &serde_json::json!({}),
            None,
        )
        .await?;
    if json {
        return print_json(&done);
    }
    print_line(&format!("{}: revoked", done.node_id));

    Ok(())
}

/// `gpurent nodes ls`: one row per GPU.
pub(super) async fn ls(api: &ApiClient, json: bool) -> Result<(), CliError> {
    let nodes: Vec<Node> = api.get("/api/v1/nodes").await?;
    if json {
        return print_json(&nodes);
    }
    let mut rows = Vec::new();
    for n in &nodes {
        // Why an unverified node gets no work (a refused agent, an old driver), on its first
        // row.
        let mut failed = n
            .verification
            .iter()
            .flat_map(|v| v.checks.iter().filter(|c| !c.ok))
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect::<Vec<_>>();
        for g in &n.gpus {
            let mut health: Vec<String> = std::mem::take(&mut failed);
            rows.push(vec![
                n.name.clone(),
                n.status.clone(),
                // A tenant there can read the node's credentials and other tenants'
                // work, or reach the node's loopback and other instances' ports: said where
                // the executor is.
                match (n.isolated, n.shared_network) {
                    (true, false) => format!("{}/{}", n.executor, n.gpu_backend),
                    (true, true) => {
                        format!("{} (network: shared)/{}", n.executor, n.gpu_backend)
                    }
                    (false, _) => format!("{} (unisolated)/{}", n.executor, n.gpu_backend),
                },
                capacity(n),
                volumes(n),
                g.uuid.clone(),
                g.model.clone(),
                g.vram_gb.to_string(),
                g.status.clone(),
                {
                    health.extend(
                        n.health
                            .iter()
                            .filter(|h| h.gpu_uuid == g.uuid)
                            .map(|h| h.detail.clone()),
                    );
                    health.join("; ")
                },
            ]);
        }
    }
    print_table(
        &[
            "NODE",
            "STATUS",
            "EXECUTOR/GPUS",
            "CPUS/MEM GB",
            "VOLUMES",
            "GPU",
            "MODEL",
            "VRAM GB",
            "GPU STATUS",
            "HEALTH",
        ],
        &rows,
    );

    Ok(())
}

/// A node's cores and memory as `nodes ls` shows them: `2/7.8`, `-` where its agent did not
/// say.
fn capacity(n: &Node) -> String {
    let cpus = n.cpus.map_or("-".to_owned(), |c| c.to_string());
    let memory = n.memory_mb.map_or("-".to_owned(), |mb| {
        // Tenths of a GiB, in integers (no float rounding in a table).
        let tenths = mb * 10 / 1024;
        format!("{}.{}", tenths / 10, tenths % 10)
    });
    format!("{cpus}/{memory}")
}

/// `gpurent nodes cordon`, `drain` and `uncordon`.
pub(super) async fn schedule_node(
    api: &ApiClient,
    node: &str,
    action: &str,
    json: bool,
) -> Result<(), CliError> {
    let done: NodeScheduled = api
        .post(
            &format!("/api/v1/nodes/{}/{action}", segment(node)),
            &serde_json::json!({}),
            None,
        )
        .await?;
    if json {
        return print_json(&done);
    }
    print_line(&format!("{}: {}", done.node_id, done.status));
    for id in &done.moved {
        print_line(&format!("moved {id}"));
    }
    Ok(())
}

/// How often `gpurent events --follow` asks for new events.
const EVENTS_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// `gpurent events`, once or with `--follow`.
pub(super) async fn events(
    api: &ApiClient,
    after: i64,
    follow: bool,
    json: bool,
) -> Result<(), CliError> {
    let mut after = after;
    loop {
        let page: Vec<Event> = api.get(&format!("/api/v1/events?after={after}")).await?;
        if !follow {
            if json {
                return print_json(&page);
            }
            print_table(&["ID", "AT", "NODE", "KIND", "DETAIL"], &event_rows(&page));
            return Ok(());
        }
        for e in &page {
            if json {
                print_json_line(e)?;
            } else {
                let row = &event_rows(std::slice::from_ref(e))[0];
                print_line(&row.join("  "));
            }
        }
        match page.last() {
            Some(last) => after = last.id,
            None => tokio::time::sleep(EVENTS_POLL).await,
        }
    }
}

fn event_rows(events: &[Event]) -> Vec<Vec<String>> {
    events
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                e.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                e.node_id.clone().unwrap_or_default(),
                e.kind.clone(),
                e.detail.clone(),
            ]
        })
        .collect()
}

/// How the node keeps volumes: `loop, 120 GB free`, `+shared` where it mounts the shared
/// storage, `unavailable: why`, or `-`.
fn volumes(n: &Node) -> String {
    let Some(v) = &n.volumes else {
        return "-".to_owned();
    };
    let mut text = match (v.enforcement.as_str(), &v.reason) {
        ("unavailable", Some(why)) => format!("unavailable: {why}"),
        (e, _) => format!(
            "{e}, {} free",
            gpurent_types::api::format_size(v.free_bytes)
        ),
    };
    if v.shared {
        text.push_str(" +shared");
    }
    text
}
