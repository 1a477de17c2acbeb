//! The CLI's API commands: each sends one request and prints the answer.

use std::collections::BTreeMap;
use std::time::Duration;

use gpurent_types::api::{
    Balance, CreateReservation, CreateUser, CreditGranted, Earnings, Event, GrantCredit, Invoice,
    JoinToken, LedgerReport, Node, NodeRevoked, NodeScheduled, Offer, Reservation,
    ReservationStopped, SpotStats, Usage, User, UserCreated,
};
use gpurent_types::{Money, Role, Tier};

use super::admin_token::{default_token, DefaultToken};
use crate::api_client::{ApiClient, CliError};
use crate::cli::{
    AdminCommand, ApiCommand as Command, CreditCommand, NodesCommand, ReserveArgs, UsersCommand,
};
use crate::output::{print_json, print_json_line, print_line, print_raw, print_table};

/// An id as one URL path segment: everything but unreserved characters percent-encoded, so
/// that an id can never reach another endpoint.
pub(crate) fn segment(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn money(s: &str, what: &str) -> Result<Money, CliError> {
    s.parse::<Money>()
        .map_err(|e| CliError::new("invalid_value", format!("{what}: {e}")))
}

fn opt_time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

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

pub async fn run(
    command: Command,
    server: &str,
    token: Option<String>,
    tls: &gpurent_agent::tls::ClientTls,
    json: bool,
) -> Result<(), CliError> {
    // An explicitly empty token means none: no fallback to the admin's.
    let (token, withheld) = match token {
        Some(t) if t.trim().is_empty() => (None, None),
        Some(t) => (Some(t), None),
        None => match default_token(server) {
            DefaultToken::Admin(t) => (Some(t), None),
            DefaultToken::Withheld(why) => (None, Some(why)),
            DefaultToken::None => (None, None),
        },
    };
    let api = ApiClient::with_tls(server, token, tls)?.unauthorized_hint(withheld);
    match command {
        Command::Users(UsersCommand::Create { name, role, credit }) => {
            let role = role
                .parse::<Role>()
                .map_err(|e| CliError::new("invalid_value", e.to_string()))?;
            let credit = credit.as_deref().map(|c| money(c, "credit")).transpose()?;
            let body = CreateUser {
                name,
                role: Some(role),
                credit,
            };
            let u: UserCreated = api.post("/api/v1/users", &body, None).await?;
            if json {
                return print_json(&u);
            }
            print_line(&format!("created {} {} ({})", u.role, u.name, u.id));
            print_line(&format!("token (shown once): {}", u.token));
        }
        Command::Users(UsersCommand::Ls) => {
            let users: Vec<User> = api.get_all("/api/v1/users").await?;
            if json {
                return print_json(&users);
            }
            let rows = users
                .iter()
                .map(|u| {
                    vec![
                        u.id.clone(),
                        u.name.clone(),
                        u.role.to_string(),
                        u.balance.to_string(),
                    ]
                })
                .collect::<Vec<_>>();
            print_table(&["ID", "NAME", "ROLE", "BALANCE"], &rows);
        }
        Command::Credit(CreditCommand::Grant {
            user_id,
            amount,
            idempotency_key,
        }) => {
            let body = GrantCredit {
                amount: money(&amount, "amount")?,
            };
            let path = format!("/api/v1/users/{}/credit", segment(&user_id));
            let g: CreditGranted = api.post(&path, &body, idempotency_key.as_deref()).await?;
            if json {
                return print_json(&g);
            }
            print_line(&format!("balance of {}: {}", g.user_id, g.balance));
        }
        Command::Balance => {
            let b: Balance = api.get("/api/v1/balance").await?;
            if json {
                return print_json(&b);
            }
            print_line(&format!("{} {}", b.balance, b.currency));
            if b.held != Money::ZERO {
                print_line(&format!("held for reservations: {} {}", b.held, b.currency));
            }
            if b.earnings != Money::ZERO {
                print_line(&format!("earned as a host: {} {}", b.earnings, b.currency));
            }
        }
        Command::Offers => {
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
                        if o.unisolated > 0 {
                            format!("{} ({} unisolated)", o.available, o.unisolated)
                        } else {
                            o.available.to_string()
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
        }
        Command::Reserve(args) => reserve(&api, args, json).await?,
        Command::Usage(window) => {
            let u: Usage = api
                .get(&format!("/api/v1/usage?{}", window.query()))
                .await?;
            if json {
                return print_json(&u);
            }
            let rows: Vec<Vec<String>> = u
                .days
                .iter()
                .map(|d| vec![d.date.clone(), d.charged.to_string()])
                .collect();
            print_table(&["DAY (UTC)", "CHARGED"], &rows);
            print_line("");
            let rows: Vec<Vec<String>> = u
                .reservations
                .iter()
                .map(|r| vec![r.reservation_id.clone(), r.charged.to_string()])
                .collect();
            print_table(&["RESERVATION", "CHARGED"], &rows);
            print_line(&format!("total {}", u.total));
        }
        Command::Invoice { month, csv, user } => {
            let mut path = format!("/api/v1/invoices/{}", segment(&month));
            if let Some(user) = &user {
                path.push_str(&format!("?user_id={}", segment(user)));
            }
            if csv {
                let sep = if user.is_some() { '&' } else { '?' };
                let (text, _) = api.get_text(&format!("{path}{sep}format=csv"), "").await?;
                print_raw(&text);
                return Ok(());
            }
            let invoice: Invoice = api.get(&path).await?;
            if json {
                return print_json(&invoice);
            }
            print_line(&format!(
                "invoice {} for {} ({}), {}",
                invoice.number, invoice.user_name, invoice.user_id, invoice.month
            ));
            let rows: Vec<Vec<String>> = invoice
                .lines
                .iter()
                .map(|l| {
                    vec![
                        l.reservation_id.clone(),
                        match l.vram_gb {
                            Some(gb) => format!("{} {gb} GB", l.gpu_type),
                            None => format!("{}x {}", l.gpu_count, l.gpu_type),
                        },
                        l.tier.to_string(),
                        l.price_per_hour.to_string(),
                        l.amount.to_string(),
                    ]
                })
                .collect();
            print_table(&["RESERVATION", "GPUS", "TIER", "PRICE/H", "AMOUNT"], &rows);
            print_line(&format!("total {} {}", invoice.total, invoice.currency));
        }
        Command::Earnings(window) => {
            let e: Earnings = api
                .get(&format!("/api/v1/earnings?{}", window.query()))
                .await?;
            if json {
                return print_json(&e);
            }
            let rows: Vec<Vec<String>> = e
                .nodes
                .iter()
                .map(|n| vec![n.node.clone(), n.node_id.clone(), n.earned.to_string()])
                .collect();
            print_table(&["NODE", "ID", "EARNED"], &rows);
            print_line(&format!("total {}", e.total));
        }
        Command::Admin(AdminCommand::Spot) => {
            let stats: SpotStats = api.get("/api/v1/admin/spot").await?;
            if json {
                return print_json(&stats);
            }
            print_line(&format!(
                "{} spot instances ended: {} completed, {} preempted, {} interrupted in all; success rate {}",
                stats.ended,
                stats.completed,
                stats.preempted,
                stats.interrupted,
                stats
                    .success_rate
                    .map_or("n/a".to_owned(), |r| format!("{:.4}%", r * 100.0))
            ));
        }
        Command::Get { id } => {
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
            for h in &r.http {
                print_line(&format!("http {}: {}", h.port, h.url));
            }
            if let Some(ssh) = &r.ssh {
                print_line(&format!("connect: {}", ssh.command));
            }
            // Why it failed, in the executor's words (`ls` has it in --json only).
            if let Some(message) = &r.end_message {
                print_line(&format!(
                    "{}: {message}",
                    r.end_reason.as_deref().unwrap_or("ended")
                ));
            }
        }
        Command::Open { id, port, browser } => {
            super::open::open(&api, &id, port, browser, json).await?
        }
        Command::Ls => {
            let rs: Vec<Reservation> = api.get_all("/api/v1/reservations").await?;
            if json {
                return print_json(&rs);
            }
            print_table(&RESERVATION_HEADER, &reservation_rows(&rs));
        }
        Command::Stop { id } => {
            let path = format!("/api/v1/reservations/{}/stop", segment(&id));
            let s: ReservationStopped = api.post(&path, &serde_json::json!({}), None).await?;
            if json {
                return print_json(&s);
            }
            print_line(&format!("{} {}", s.id, s.status));
        }
        Command::Ssh(args) => super::ssh::run(&api, args).await?,
        Command::SshConfig(args) => super::ssh_config::run(&api, args, json).await?,
        Command::Cp(args) => super::cp::run(&api, args, json).await?,
        Command::PortForward(args) => super::port_forward::run(&api, args, json).await?,
        Command::Logs { id, follow, out } => logs(&api, &id, follow, out.as_deref()).await?,
        Command::Nodes(NodesCommand::JoinToken) => {
            let t: JoinToken = api
                .post("/api/v1/nodes/join-token", &serde_json::json!({}), None)
                .await?;
            if json {
                return print_json(&t);
            }
            print_line(&t.token);
        }
        Command::Events { after, follow } => events(&api, after, follow, json).await?,
        Command::Nodes(NodesCommand::Cordon { node }) => {
            schedule_node(&api, &node, "cordon", json).await?;
        }
        Command::Nodes(NodesCommand::Drain { node }) => {
            schedule_node(&api, &node, "drain", json).await?;
        }
        Command::Nodes(NodesCommand::Uncordon { node }) => {
            schedule_node(&api, &node, "uncordon", json).await?;
        }
        Command::Nodes(NodesCommand::Revoke { node }) => {
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
        }
        Command::Nodes(NodesCommand::Ls) => {
            let nodes: Vec<Node> = api.get("/api/v1/nodes").await?;
            if json {
                return print_json(&nodes);
            }
            let mut rows = Vec::new();
            for n in &nodes {
                for g in &n.gpus {
                    rows.push(vec![
                        n.name.clone(),
                        n.status.clone(),
                        // A tenant there can read the node's credentials and other tenants'
                        // work: said where the executor is.
                        if n.isolated {
                            format!("{}/{}", n.executor, n.gpu_backend)
                        } else {
                            format!("{} (unisolated)/{}", n.executor, n.gpu_backend)
                        },
                        capacity(n),
                        g.uuid.clone(),
                        g.model.clone(),
                        g.vram_gb.to_string(),
                        g.status.clone(),
                        n.health
                            .iter()
                            .filter(|h| h.gpu_uuid == g.uuid)
                            .map(|h| h.detail.as_str())
                            .collect::<Vec<_>>()
                            .join("; "),
                    ]);
                }
            }
            print_table(
                &[
                    "NODE",
                    "STATUS",
                    "EXECUTOR/GPUS",
                    "CPUS/MEM GB",
                    "GPU",
                    "MODEL",
                    "VRAM GB",
                    "GPU STATUS",
                    "HEALTH",
                ],
                &rows,
            );
        }
        Command::Admin(AdminCommand::LedgerCheck) => {
            let report: LedgerReport = api.get("/api/v1/admin/ledger-check").await?;
            if json {
                print_json(&report)?;
            } else {
                print_line(&format!(
                    "{}: {} transfers, balances sum to {}, {} mismatched accounts",
                    if report.ok { "ok" } else { "BROKEN" },
                    report.transfers,
                    report.sum,
                    report.mismatched.len()
                ));
                for m in &report.mismatched {
                    print_line(&format!(
                        "  {}: cached {} but transfers say {}",
                        m.account, m.cached, m.derived
                    ));
                }
                for p in &report.problems {
                    print_line(&format!("  {p}"));
                }
            }
            if !report.ok {
                // Exit 1 with the report already printed: not an error of the command.
                std::process::exit(1);
            }
        }
        Command::Report(report) => super::report::run(&api, report, json).await?,
        Command::Audit(audit) => super::audit::run(&api, audit, json).await?,
        Command::Users(UsersCommand::Passwd { user_id }) => {
            super::access::passwd(&api, user_id, json).await?;
        }
        Command::Users(UsersCommand::Limits {
            user_id,
            max_reservations,
            max_spend_per_hour,
        }) => {
            super::access::limits(&api, &user_id, max_reservations, max_spend_per_hour, json)
                .await?;
        }
        Command::Users(UsersCommand::Role { user_id, role }) => {
            super::access::role(&api, &user_id, &role, json).await?;
        }
        Command::Tokens(command) => super::access::tokens(&api, command, json).await?,
        Command::Keys(command) => super::ssh_keys::keys(&api, command, json).await?,
        Command::Login { name } => super::access::login(&api, &name, json).await?,
        Command::Openapi => {
            return print_json(&gpurent_server::openapi_document());
        }
    }
    Ok(())
}

async fn reserve(api: &ApiClient, args: ReserveArgs, json: bool) -> Result<(), CliError> {
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
    };
    let r: Reservation = api
        .post(
            "/api/v1/reservations",
            &body,
            args.idempotency_key.as_deref(),
        )
        .await?;
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

async fn schedule_node(
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

async fn events(api: &ApiClient, after: i64, follow: bool, json: bool) -> Result<(), CliError> {
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

/// Prints the reservation's log (or writes it to `out`), its bytes as they are.
async fn logs(
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
