//! `/admin`: the fleet at a glance for admins (GPUs allocated and free by type, the queue,
//! nodes out of service, revenue today), refreshed live, with links to the other admin pages.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::Method;
use axum::response::Response;
use gpurent_types::api::{Node, Offer, Reservation};
use gpurent_types::report::DailyReport;
use gpurent_types::Money;
use maud::{html, Markup};

use super::instances::gpus;
use crate::console::api::{Api, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, money, raw, status, time, Ctx, PageError};
use crate::state::AppState;

/// The most nodes the page reads (pages of the API's largest size).
const MAX_NODES: usize = 10_000;
/// The queued reservations are listed from this many newest reservations (the API's list has
/// no filter); how many wait of each type is the exact figure of `/metrics`.
const QUEUE_WINDOW: u32 = 200;

/// The admin pages, for the links at the top of each.
pub(crate) fn subnav(l: Lang, current: &str) -> Markup {
    let pages = [
        ("/admin", l.t("Fleet", "机群概览")),
        ("/admin/users", l.t("Users", "用户")),
        ("/admin/reservations", l.t("Reservations", "预订")),
        ("/admin/events", l.t("Events", "事件")),
        ("/admin/audit", l.t("Audit trail", "审计日志")),
        ("/admin/reports", l.t("Reports", "报表")),
        ("/admin/ledger", l.t("Ledger check", "账本核对")),
    ];
    html! {
        nav.subnav aria-label=(l.t("Admin pages", "管理页面")) {
            ul {
                @for (href, label) in pages {
                    li { a href=(href) aria-current=[(href == current).then_some("page")] { (label) } }
                }
            }
        }
    }
}

/// Every node, a page at a time.
pub(crate) async fn all_nodes(api: &Api) -> Result<Vec<Node>, Failure> {
    let mut nodes = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!(
                "/api/v1/nodes?limit=1000&after={}",
                crate::console::api::enc(a)
            ),
            None => "/api/v1/nodes?limit=1000".to_owned(),
        };
        let (page, next) = api.page::<Node>(&path).await?;
        nodes.extend(page);
        match next {
            Some(n) if nodes.len() < MAX_NODES => after = Some(n),
            _ => return Ok(nodes),
        }
    }
}

/// One GPU type's count of GPUs: on nodes in service, by state, and on nodes out of it.
#[derive(Debug, Default, Clone, Copy)]
struct TypeCount {
    total: u32,
    allocated: u32,
    shared: u32,
    free: u32,
    out_of_service: u32,
    rentable: u32,
    queued: u64,
}

fn by_type(nodes: &[Node], offers: &[Offer]) -> BTreeMap<String, TypeCount> {
    let mut out: BTreeMap<String, TypeCount> = BTreeMap::new();
    for node in nodes {
        let in_service = node.status == "ready";
        for gpu in &node.gpus {
            let c = out.entry(gpu.model.clone()).or_default();
            c.total += 1;
            if !in_service {
                c.out_of_service += 1;
                continue;
            }
            match gpu.status.as_str() {
                "allocated" => c.allocated += 1,
                "shared" => c.shared += 1,
                _ => c.free += 1,
            }
        }
    }
    for offer in offers {
        out.entry(offer.gpu_type.clone()).or_default().rentable = offer.available;
    }
    out
}

/// The queue per GPU type, from `/metrics`: how many wait, and the longest wait in seconds.
async fn queue_lengths(api: &Api) -> Result<BTreeMap<String, (u64, f64)>, Failure> {
    let (_, body) = api.send(Method::GET, "/metrics", None).await?;
    let text = String::from_utf8_lossy(&body);
    let mut out: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(gpu_type) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("gpu_type=\""))
            .and_then(|v| v.strip_suffix('"'))
        else {
            continue;
        };
        let entry = out.entry(gpu_type.to_owned()).or_default();
        match name {
            "gpurent_queue_length" => entry.0 = value.trim().parse().unwrap_or(0),
            "gpurent_queue_oldest_wait_seconds" => entry.1 = value.trim().parse().unwrap_or(0.0),
            _ => {}
        }
    }
    out.retain(|_, (n, _)| *n > 0);
    Ok(out)
}

/// Today's daily report (reused for a few seconds: `report_cache`).
async fn today_report(state: &AppState, api: &Api) -> Result<Arc<DailyReport>, Failure> {
    crate::console::report_cache::daily(state, api, &today(state)).await
}

/// Today (UTC), as the daily report's `date`.
fn today(state: &AppState) -> String {
    state.now().format("%Y-%m-%d").to_string()
}

pub(crate) async fn page(State(state): State<AppState>, ctx: Ctx) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?;
    // Five reads that need nothing of each other, made at once.
    let newest_path = format!("/api/v1/reservations?limit={QUEUE_WINDOW}");
    let (nodes, offers, newest, report, lengths) = tokio::join!(
        all_nodes(&api),
        api.get::<Vec<Offer>>("/api/v1/offers"),
        api.page::<Reservation>(&newest_path),
        // The only figure of today's money the API has: the daily report's revenue so far.
        today_report(&state, &api),
        queue_lengths(&api),
    );
    let nodes = nodes.map_err(|f| ctx.failed(f))?;
    let offers = offers.map_err(|f| ctx.failed(f))?;
    let (newest, more) = newest.map_err(|f| ctx.failed(f))?;
    let lengths = lengths.unwrap_or_default();
    let mut types = by_type(&nodes, &offers);
    for (gpu_type, (n, _)) in &lengths {
        types.entry(gpu_type.clone()).or_default().queued = *n;
    }
    let queue: Vec<&Reservation> = newest
        .iter()
        .filter(|r| r.status.as_str() == "pending" && r.node.is_none())
        .collect();
    let out: Vec<&Node> = nodes.iter().filter(|n| n.status != "ready").collect();
    // The exact count where `/metrics` answered, else what the newest reservations show.
    let waiting = if lengths.is_empty() {
        u64::try_from(queue.len()).unwrap_or(u64::MAX)
    } else {
        lengths.values().map(|(n, _)| n).sum()
    };
    let sum = |f: fn(&TypeCount) -> u32| types.values().map(f).sum::<u32>();
    let body = html! {
        (subnav(l, "/admin"))
        div id="fleet" data-live="2000" {
            div.tiles {
                div.tile { span.n { (sum(|c| c.total)) } (l.t("GPUs", "GPU 总数")) }
                div.tile { span.n { (sum(|c| c.allocated) + sum(|c| c.shared)) } (l.t("allocated (wholly or shared)", "已分配（整卡或共享）")) }
                div.tile { span.n { (sum(|c| c.free)) } (l.t("free", "空闲")) }
                div.tile data-field="queued" { span.n { (waiting) } (l.t("waiting in the queue", "排队中")) }
                div.tile { span.n { (nodes.len() - out.len()) " / " (nodes.len()) } (l.t("nodes ready", "就绪节点")) }
                div.tile {
                    @match &report {
                        Ok(r) => { span.n { (money(r.totals.revenue)) } (l.t("revenue today (UTC)", "今日收入（UTC）")) }
                        Err(_) => { span.n { "—" } (l.t("revenue today (UTC)", "今日收入（UTC）")) }
                    }
                }
            }
            (types_table(l, &types))
            (revenue(l, &report))
            (queue_table(l, &queue, &lengths, waiting, more.is_some()))
            (out_of_service(l, &out))
        }
    };
    Ok(ctx.page(l.t("Fleet", "机群概览"), body))
}

fn types_table(l: Lang, types: &BTreeMap<String, TypeCount>) -> Markup {
    html! {
        section aria-labelledby="types-h" {
            h2 id="types-h" { (l.t("GPUs by type", "按型号统计 GPU")) }
            @if types.is_empty() {
                p.empty { (l.t("No nodes have joined yet.", "还没有节点加入。")) }
            } @else {
                div.scroll { table data-table="gpu-types" {
                    thead { tr {
                        th scope="col" { (l.t("Type", "型号")) }
                        th scope="col" { (l.t("GPUs", "GPU 数")) }
                        th scope="col" { (l.t("Allocated", "已分配")) }
                        th scope="col" { (l.t("Shared", "共享中")) }
                        th scope="col" { (l.t("Free", "空闲")) }
                        th scope="col" { (l.t("Rentable now", "当前可租")) }
                        th scope="col" { (l.t("On nodes out of service", "停用节点上")) }
                        th scope="col" { (l.t("Queued", "排队中")) }
                    } }
                    tbody { @for (model, c) in types {
                        tr data-gpu-type=(model) {
                            th scope="row" { (raw(model)) }
                            td { (c.total) }
                            td data-field="allocated" { (c.allocated) }
                            td data-field="shared" { (c.shared) }
                            td data-field="free" { (c.free) }
                            td { (c.rentable) }
                            td { (c.out_of_service) }
                            td data-field="queued" { (c.queued) }
                        }
                    } }
                } }
                p.hint { (l.t("Shared: part of its memory is rented. Rentable now: free whole GPUs on nodes that take work (the offers).", "共享中：部分显存已出租。当前可租：可接受任务的节点上空闲的整卡（即算力市场）。")) }
            }
        }
    }
}

fn revenue(l: Lang, report: &Result<Arc<DailyReport>, Failure>) -> Markup {
    html! {
        section aria-labelledby="revenue-h" {
            h2 id="revenue-h" { (l.t("Revenue today", "今日收入")) }
            @match report {
                Ok(r) => {
                    dl.facts data-field="revenue" {
                        dt { (l.t("Charged to tenants", "向租户收取")) } dd { (money(r.totals.revenue)) }
                        dt { (l.t("Hosts' share", "主机方分成")) } dd { (money(r.totals.host_earnings)) }
                        dt { (l.t("Platform's share", "平台所得")) }
                        dd { (money(r.totals.revenue.checked_sub(r.totals.host_earnings).unwrap_or(Money::ZERO))) }
                        dt { (l.t("GPU-hours", "GPU 小时")) } dd { (r.totals.gpu_hours) }
                        dt { (l.t("Allocated", "分配率")) } dd { (format!("{:.1}", r.totals.allocation_pct)) " %" }
                    }
                    p.hint { (l.t("From the daily report of today (UTC) so far:", "来自今日（UTC）至今的日报：")) " "
                        a href={ "/admin/reports?date=" (r.date) } { (l.t("the whole report", "查看完整日报")) } }
                }
                Err(f) => { (alert(l, f)) }
            }
        }
    }
}

fn queue_table(
    l: Lang,
    queue: &[&Reservation],
    lengths: &BTreeMap<String, (u64, f64)>,
    waiting: u64,
    windowed: bool,
) -> Markup {
    html! {
        section aria-labelledby="queue-h" {
            h2 id="queue-h" { (l.t("The queue", "排队队列")) }
            @if !lengths.is_empty() {
                ul.plain data-field="queue-lengths" {
                    @for (gpu_type, (n, oldest)) in lengths {
                        li { (raw(gpu_type)) ": " (n) " · " (l.t("longest wait", "最长等待")) " "
                            (format!("{:.0}", oldest / 60.0)) " " (l.t("min", "分钟")) }
                    }
                }
            }
            @if queue.is_empty() && waiting == 0 {
                p.empty { (l.t("Nothing is waiting for GPUs.", "没有等待 GPU 的预订。")) }
            } @else if !queue.is_empty() {
                div.scroll { table data-table="queue" {
                    thead { tr {
                        th scope="col" { (l.t("Reservation", "预订")) }
                        th scope="col" { (l.t("Tenant", "租户")) }
                        th scope="col" { (l.t("GPUs", "GPU")) }
                        th scope="col" { (l.t("Why it waits", "等待原因")) }
                        th scope="col" { (l.t("Waiting since", "开始等待")) }
                    } }
                    tbody { @for r in queue {
                        tr data-reservation-id=(r.id) {
                            th scope="row" { a href={ "/instances/" (r.id) } { (raw(&r.id)) } }
                            td { (raw(&r.tenant_id)) }
                            td { (gpus(l, r)) }
                            td { @if let Some(why) = &r.queue_reason { (raw(why)) } }
                            td { (time(r.created_at)) }
                        }
                    } }
                } }
            }
            @if windowed && u64::try_from(queue.len()).unwrap_or(u64::MAX) < waiting {
                p.hint { (l.t("Listed: those among the newest 200 reservations.", "列表仅含最新的 200 个预订中的排队项。")) " "
                    a href="/admin/reservations?status=pending" { (l.t("All reservations", "全部预订")) } }
            }
        }
    }
}

fn out_of_service(l: Lang, out: &[&Node]) -> Markup {
    html! {
        section aria-labelledby="out-h" {
            h2 id="out-h" { (l.t("Lost and unhealthy nodes", "失联与不健康的节点")) }
            @if out.is_empty() {
                p.empty { (l.t("Every node is ready.", "所有节点均已就绪。")) }
            } @else {
                div.scroll { table data-table="out-of-service" {
                    thead { tr {
                        th scope="col" { (l.t("Node", "节点")) }
                        th scope="col" { (l.t("Status", "状态")) }
                        th scope="col" { (l.t("GPUs", "GPU 数")) }
                        th scope="col" { (l.t("Health", "健康状况")) }
                        th scope="col" { (l.t("Last seen", "最后在线")) }
                    } }
                    tbody { @for n in out {
                        tr data-node=(n.name) {
                            th scope="row" { (raw(&n.name)) }
                            td { (status(&n.status)) }
                            td { (n.gpus.len()) }
                            td { @for h in &n.health { (raw(&format!("{}: {}", h.rule, h.detail))) " " } }
                            td { (time(n.last_seen_at)) }
                        }
                    } }
                } }
            }
        }
    }
}
