//! Reservations: reserve, get, ls, stop, logs, and the offers to reserve from.

use std::collections::BTreeMap;
use std::time::Duration;

use gpurent_types::api::{CreateReservation, Offer, Reservation, ReservationStopped};
use gpurent_types::{ReservationStatus, Tier};

use super::{money, opt_time, segment};
use crate::api_client::{ApiClient, CliError};
use crate::cli::ReserveArgs;
use crate::output::{print_json, print_line, print_table};

fn reservation_rows(rs: &[Reservation]) -> Vec<Vec<String>> {
    rs.iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.status.to_string(),
                match r.vram_gb {
                    Some(gb) => format!("{} ({gb} GB)", r.gpu_type),
                    None => format!("{}x {}", r.gpu_count, r.gpu_type),
                },
                r.node.clone().unwrap_or_else(|| "-".into()),
                r.tier.to_string(),
                r.price_per_hour.to_string(),
                r.charged.to_string(),
                opt_time(r.started_at),
                opt_time(r.ended_at),
                if r.ports.is_empty() {
                    "-".to_owned()
                } else {
                    r.ports
                        .iter()
                        .map(|p| format!("{}->{}", p.host_port, p.container_port))
                        .collect::<Vec<_>>()
                        .join(",")
                },
            ]
        })
        .collect()
}

const RESERVATION_HEADER: [&str; 10] = [
    "ID", "STATUS", "GPUS", "NODE", "TIER", "PRICE/H", "CHARGED", "STARTED", "ENDED", "PORTS",
];

/// `gpurent reserve`.
pub(super) async fn reserve(
    api: &ApiClient,
    args: ReserveArgs,
    json: bool,
) -> Result<(), CliError> {
    let tier = args
        .tier
        .as_deref()
        .map(|t| {
            t.parse::<Tier>()
                .map_err(|e| CliError::new("invalid_value", e.to_string()))
        })
        .transpose()?;
    let mut env = BTreeMap::new();
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| CliError::new("invalid_value", format!("--env {kv:?} is not K=V")))?;
        env.insert(k.to_owned(), v.to_owned());
    }
    let body = CreateReservation {
        gpu_type: args.gpu,
        gpu_count: args.count,
        vram_gb: args.vram_gb,
        vram_fraction: args.vram_fraction,
        hours: args.hours,
        tier,
        bid: args.bid.as_deref().map(|b| money(b, "bid")).transpose()?,
        image: args.image,
        command: args.command,
        env,
        ports: args.ports,
        http_ports: args.http_ports,
        queue: args.queue,
        on_node_loss: Some(match args.on_node_loss {
            crate::cli::OnNodeLossArg::Reschedule => gpurent_types::OnNodeLoss::Reschedule,
            crate::cli::OnNodeLossArg::Stop => gpurent_types::OnNodeLoss::Stop,
        }),
        idle_reclaim: args.no_idle_reclaim.then_some(false),
        checkpoint: args.checkpoint,
        secrets: args
            .secrets
            .iter()
            .map(|name| {
                std::env::var(name).map(|v| (name.clone(), v)).map_err(|_| {
                    CliError::new(
                        "invalid_value",
                        format!("--secret {name}: set {name} in the environment to its value"),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
        volumes: args
            .volumes
            .iter()
            .map(|v| {
                gpurent_types::api::MountVolume::parse(v)
                    .map_err(|e| CliError::new("invalid_value", format!("--volume {e}")))
            })
            .collect::<Result<_, _>>()?,
        template: args.template,
        team: args.team,
        restart: args
            .restart
            .as_deref()
            .map(|p| {
                p.parse::<gpurent_types::RestartPolicy>()
                    .map_err(|e| CliError::new("invalid_value", format!("--restart: {e}")))
            })
            .transpose()?,
        max_restarts: args.max_restarts,
        checkpoint_volume: args.checkpoint_volume,
        array: args.array,
    };
    // Always keyed, so that a retry through a failover (its first answer lost) reserves once.
    let key = args
        .idempotency_key
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let r: Reservation = api.post("/api/v1/reservations", &body, Some(&key)).await?;
    if json {
        return print_json(&r);
    }
    print_line(&format!(
        "reserved {}: {} on {} at {}/h ({})",
        r.id,
        match r.vram_gb {
            Some(gb) => format!("{gb} GB of one {}", r.gpu_type),
            None => format!("{}x {}", r.gpu_count, r.gpu_type),
        },
        r.node.as_deref().unwrap_or("-"),
        r.price_per_hour,
        r.status
    ));
    if let Some(reason) = &r.queue_reason {
        print_line(&format!("queued: {reason}"));
    }
    if let Some(a) = &r.array {
        print_array(&r.id, a);
    }
    Ok(())
}

/// An array's tasks counted, and how to name one.
fn print_array(id: &str, a: &gpurent_types::api::ArraySummary) {
    print_line(&format!(
        "array {}: {} tasks: {} done, {} running, {} failed, {} stopped, {} queued (a task: {id}[INDEX])",
        a.spec, a.tasks, a.done, a.running, a.failed, a.stopped, a.queued
    ));
    if let Some(message) = &a.message {
        print_line(&format!("array: {message}"));
    }
}

/// `gpurent offers`.
pub(super) async fn offers(api: &ApiClient, json: bool) -> Result<(), CliError> {
    let offers: Vec<Offer> = api.get("/api/v1/offers").await?;
    if json {
        return print_json(&offers);
    }
    let rows = offers
        .iter()
        .map(|o| {
            vec![
                o.gpu_type.clone(),
                o.vram_gb.to_string(),
                match (o.unisolated, o.shared_network) {
                    (0, 0) => o.available.to_string(),
                    (0, shared) => format!("{} ({shared} network: shared)", o.available),
                    (unisolated, _) => format!("{} ({unisolated} unisolated)", o.available),
                },
                o.price_per_hour.to_string(),
                format!(
                    "{} then {}",
                    o.stepped_price_per_hour, o.stepped_then_per_hour
                ),
                o.spot_min_bid.to_string(),
                o.reserved_discounts
                    .iter()
                    .map(|d| d.price_per_hour.to_string())
                    .collect::<Vec<_>>()
                    .join(" / "),
                o.share_price_per_gb_hour.to_string(),
            ]
        })
        .collect::<Vec<_>>();
    print_table(
        &[
            "GPU",
            "VRAM GB",
            "AVAILABLE",
            "PRICE/H",
            "STEPPED/H",
            "SPOT FROM/H",
            "RESERVED/H",
            "SHARE/GB/H",
        ],
        &rows,
    );
    if let Some(o) = offers.first() {
        print_line(&format!(
            "prices in {} for one whole GPU; a share costs its part of the GPU's price",
            o.currency
        ));
        print_line(&format!(
            "stepped: the first price for {} h, then the second",
            o.stepped_first_hours
        ));
        let blocks: Vec<String> = o
            .reserved_discounts
            .iter()
            .map(|d| format!("{}% off from {} h", d.percent, d.min_hours))
            .collect();
        if !blocks.is_empty() {
            print_line(&format!("reserved blocks: {}", blocks.join(", ")));
        }
    }

    Ok(())
}

/// `gpurent get`.
pub(super) async fn get(api: &ApiClient, id: String, json: bool) -> Result<(), CliError> {
    let r: Reservation = api
        .get(&format!("/api/v1/reservations/{}", segment(&id)))
        .await?;
    if json {
        return print_json(&r);
    }
    print_table(
        &RESERVATION_HEADER,
        &reservation_rows(std::slice::from_ref(&r)),
    );
    if let Some(a) = &r.array {
        print_array(&r.id, a);
    }
    if let (Some(array), Some(index)) = (&r.array_id, r.array_index) {
        print_line(&format!("task {array}[{index}] of a job array"));
    }
    for h in &r.http {
        // The browser's address (opened with `gpurent open`), then the bearer token's.
        print_line(&format!(
            "http {}: {} (browser: gpurent open {} {}; with a token: {})",
            h.port, h.app_url, r.id, h.port, h.url
        ));
    }
    if let Some(ssh) = &r.ssh {
        print_line(&format!("connect: {}", ssh.command));
    }
    if let Some(team) = &r.team {
        print_line(&format!(
            "team: {team} (paid from its balance; made by {})",
            r.created_by.as_deref().unwrap_or("-")
        ));
    }
    if r.borrowed {
        print_line(
            "borrowed: beyond its quota of this GPU type, it is the first preempted when a \
             quota's owner needs the GPUs back",
        );
    }
    for v in &r.volumes {
        print_line(&format!(
            "volume {} at {}{}",
            v.name,
            v.path,
            if v.read_only { " (read-only)" } else { "" }
        ));
    }
    if let Some(disk) = &r.disk {
        print_line(&format!(
            "disk: {} used of {}",
            gpurent_types::api::format_size(disk.used_bytes),
            gpurent_types::api::format_size(disk.size_bytes)
        ));
    }
    if let (Some(p), ReservationStatus::Starting | ReservationStatus::Pending) = (&r.pull, r.status)
    {
        print_line(&format!(
            "pulling {}: {} of {} layers, {} of {}",
            p.image,
            p.layers_done,
            p.layers_total,
            gpurent_types::api::format_size(p.bytes_done),
            gpurent_types::api::format_size(p.bytes_total)
        ));
    }
    if r.restart != gpurent_types::RestartPolicy::Never {
        let counted = r.restarts.iter().filter(|x| x.counted).count();
        print_line(&format!(
            "restart: {} ({} restarts, {counted} of {} counted)",
            r.restart.as_str(),
            r.restarts.len(),
            r.max_restarts
        ));
    }
    for x in &r.restarts {
        print_line(&format!(
            "run {} on {} from {} to {}: {}{}",
            x.epoch,
            x.node.as_deref().unwrap_or("-"),
            x.started_at.map_or("-".to_owned(), |t| t
                .format("%Y-%m-%d %H:%M:%S")
                .to_string()),
            x.at.format("%Y-%m-%d %H:%M:%S UTC"),
            x.cause,
            x.message
                .as_deref()
                .map(|m| format!(" ({m})"))
                .unwrap_or_default()
        ));
    }
    // Only while it waits for its back-off.
    if let Some(at) = r.retry_at {
        print_line(&format!(
            "next run: not before {} (back-off)",
            at.format("%Y-%m-%d %H:%M:%S UTC")
        ));
    }
    // Why it failed, in the executor's words (`ls` has it in --json only).
    if let Some(message) = &r.end_message {
        print_line(&format!(
            "{}: {message}",
            r.end_reason.as_deref().unwrap_or("ended")
        ));
    }

    Ok(())
}

/// `gpurent ls`.
pub(super) async fn ls(api: &ApiClient, json: bool) -> Result<(), CliError> {
    // The job arrays first, each as one line; their tasks are not in the list.
    let mut rs: Vec<Reservation> = api.get("/api/v1/arrays").await?;
    rs.extend(api.get_all::<Reservation>("/api/v1/reservations").await?);
    if json {
        return print_json(&rs);
    }
    print_table(&RESERVATION_HEADER, &reservation_rows(&rs));
    for r in &rs {
        if let Some(a) = &r.array {
            print_array(&r.id, a);
        }
    }

    Ok(())
}

/// `gpurent stop`.
pub(super) async fn stop(api: &ApiClient, id: String, json: bool) -> Result<(), CliError> {
    let path = format!("/api/v1/reservations/{}/stop", segment(&id));
    // Stopping twice stops once: retried through a failover like a read.
    let s: ReservationStopped = api.post_idempotent(&path, &serde_json::json!({})).await?;
    if json {
        return print_json(&s);
    }
    print_line(&format!("{} {}", s.id, s.status));

    Ok(())
}

/// Prints the reservation's log (or writes it to `out`), its bytes as they are.
pub(crate) async fn logs(
    api: &ApiClient,
    id: &str,
    follow: bool,
    out: Option<&std::path::Path>,
) -> Result<(), CliError> {
    use std::io::Write;
    let mut sink: Box<dyn Write> = match out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| {
                CliError::new("io_error", format!("cannot create {}: {e}", path.display()))
            })?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let write_error =
        |e: std::io::Error| CliError::new("io_error", format!("cannot write the log: {e}"));
    let path = |offset: u64| format!("/api/v1/reservations/{}/logs?offset={offset}", segment(id));
    let mut offset: u64 = 0;
    loop {
        let (bytes, next) = api.get_bytes(&path(offset), "x-log-next-offset").await?;
        if !bytes.is_empty() {
            sink.write_all(&bytes).map_err(write_error)?;
            sink.flush().map_err(write_error)?;
        }
        let next = next.and_then(|n| n.parse().ok()).unwrap_or(offset);
        let advanced = next > offset;
        offset = next;
        if advanced {
            continue;
        }
        if !follow {
            break;
        }
        // Nothing new: done once the reservation has ended (its agent ships the rest before
        // it reports the end), else wait for more.
        let r: Reservation = api
            .get(&format!("/api/v1/reservations/{}", segment(id)))
            .await?;
        if r.status.is_terminal() {
            let (rest, _) = api.get_bytes(&path(offset), "x-log-next-offset").await?;
            sink.write_all(&rest).map_err(write_error)?;
            offset += rest.len() as u64;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    sink.flush().map_err(write_error)?;
    if let Some(path) = out {
        eprintln!("wrote {offset} bytes of the log to {}", path.display());
    }
    Ok(())
}
