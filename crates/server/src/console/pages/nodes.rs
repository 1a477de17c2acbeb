//! `/nodes` (hosts and admins): the viewer's nodes (an admin's: all) with each GPU's live
//! figures, status, verification and health; cordon, drain and uncordon; join tokens; and what
//! the nodes earned per month.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{Datelike, Months, NaiveDate};
use gpurent_types::api::{Earnings, Gpu, JoinToken, Node, NodeScheduled};
use gpurent_types::{Money, Role};
use maud::{html, Markup};
use serde::Deserialize;

use crate::console::api::{enc, Api, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, money, raw, time, Ctx, PageError};
use crate::state::AppState;

/// Nodes per page (each with its GPUs, refreshed every 2 s); the fleet beyond is on the next
/// pages.
const PAGE: u32 = 50;
/// Months of earnings shown: the chosen one and those before it.
const MONTHS: u32 = 3;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct NodesQuery {
    /// The last month of the earnings table, `YYYY-MM` (default: this month, UTC).
    month: Option<String>,
    /// The node id to list after (the previous page's last).
    after: Option<String>,
    /// What the form before this page did: `cordon`, `drain`, `uncordon`.
    done: Option<String>,
    /// The node it was done to.
    node: Option<String>,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: HeaderMap,
    Query(q): Query<NodesQuery>,
) -> Result<Response, PageError> {
    render(&state, &ctx, &headers, &q, None).await
}

/// A new join token, shown on the page that answers the form and nowhere else.
pub(crate) async fn join_token(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let token: JoinToken = api
        .call(
            Method::POST,
            "/api/v1/nodes/join-token",
            &serde_json::json!({}),
        )
        .await
        .map_err(|f| ctx.failed(f))?;
    render(&state, &ctx, &headers, &NodesQuery::default(), Some(&token)).await
}

async fn render(
    state: &AppState,
    ctx: &Ctx,
    headers: &HeaderMap,
    q: &NodesQuery,
    token: Option<&JoinToken>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(state)?;
    let mut path = format!("/api/v1/nodes?limit={PAGE}");
    if let Some(after) = q.after.as_deref().filter(|a| !a.is_empty()) {
        path.push_str(&format!("&after={}", enc(after)));
    }
    let (nodes, next): (Vec<Node>, _) = api.page(&path).await.map_err(|f| ctx.failed(f))?;
    let this_month = state.now().date_naive().with_day(1).unwrap_or_default();
    let (last_month, month_failure) = match q.month.as_deref().map(str::trim) {
        None | Some("") => (this_month, None),
        Some(m) => match month_start(m) {
            Some(d) => (d, None),
            None => (
                this_month,
                Some(Failure {
                    status: StatusCode::UNPROCESSABLE_ENTITY,
                    code: "validation".into(),
                    message: format!("month: {m:?} is not YYYY-MM"),
                }),
            ),
        },
    };
    // console.js refreshing the nodes every 2 s takes only them: the earnings are not asked for.
    let earnings = if headers.contains_key(crate::console::LIVE_HEADER) {
        EarningsTable {
            months: Vec::new(),
            nodes: BTreeMap::new(),
            totals: Vec::new(),
        }
    } else {
        earnings(ctx, &api, &nodes, last_month).await?
    };
    let server = server_url(ctx, headers);
    let body = html! {
        @if let Some(done) = &q.done { (done_note(l, done, q.node.as_deref())) }
        section aria-labelledby="nodes-h" {
            h2 id="nodes-h" {
                @if ctx.role() == Some(Role::Admin) { (l.t("Every node", "全部节点")) } @else { (l.t("Your nodes", "您的节点")) }
            }
            div id="nodes" data-live="2000" {
                @if nodes.is_empty() {
                    p.empty { (l.t("No nodes yet: make a join token below and start an agent with it.", "还没有节点：在下方生成加入令牌，并用它启动代理程序。")) }
                }
                @for n in &nodes { (node_card(ctx, n)) }
            }
            p.actions {
                @if q.after.as_deref().is_some_and(|a| !a.is_empty()) {
                    a href="/nodes" { "← " (l.t("First nodes", "最前面的节点")) }
                }
                @if let Some(next) = &next {
                    a href={ "/nodes?after=" (enc(next)) } { (l.t("More nodes", "更多节点")) " →" }
                }
            }
        }
        section aria-labelledby="join-h" {
            h2 id="join-h" { (l.t("Add a node", "添加节点")) }
            @if let Some(t) = token { (join_note(l, t, &server)) }
            form.card method="post" action="/nodes" data-form="join-token" {
                (ctx.csrf_field())
                p.hint { (l.t("A join token registers agents for 24 hours; the nodes are yours and earn for you.", "加入令牌在 24 小时内可用于注册代理程序；这些节点归您所有，收益归您。")) }
                button type="submit" data-action="join-token" { (l.t("New join token", "生成加入令牌")) }
            }
        }
        section aria-labelledby="earnings-h" {
            h2 id="earnings-h" { (l.t("Earnings per node and month", "各节点每月收益")) }
            @if let Some(f) = &month_failure { (alert(l, f)) }
            form.card.range method="get" action="/nodes" {
                div.fields {
                    div {
                        label for="month" { (l.t("Up to the month (UTC)", "截至月份（UTC）")) }
                        input id="month" name="month" type="month" value=(last_month.format("%Y-%m")) required;
                    }
                    div { button type="submit" { (l.t("Show", "显示")) } }
                }
            }
            (earnings_table(l, &earnings))
        }
    };
    Ok(ctx.page(l.t("Nodes", "节点"), body))
}

/// The first day of a `YYYY-MM`.
fn month_start(month: &str) -> Option<NaiveDate> {
    (month.len() == 7)
        .then(|| NaiveDate::parse_from_str(&format!("{month}-01"), "%Y-%m-%d").ok())
        .flatten()
}

/// Earned per node in each month up to `last`: (months, node name, earned per month).
struct EarningsTable {
    months: Vec<String>,
    nodes: BTreeMap<String, Vec<Money>>,
    totals: Vec<Money>,
}

/// The viewer's earnings, month by month; an admin's: those of every owner of the nodes listed.
async fn earnings(
    ctx: &Ctx,
    api: &Api,
    nodes: &[Node],
    last: NaiveDate,
) -> Result<EarningsTable, PageError> {
    let mut owners: Vec<Option<&str>> = if ctx.role() == Some(Role::Admin) {
        let mut o: Vec<&str> = nodes.iter().filter_map(|n| n.owner_id.as_deref()).collect();
        o.sort_unstable();
        o.dedup();
        o.into_iter().map(Some).collect()
    } else {
        vec![None]
    };
    if owners.is_empty() {
        owners.push(None);
    }
    let starts: Vec<NaiveDate> = (0..MONTHS)
        .rev()
        .filter_map(|back| last.checked_sub_months(Months::new(back)))
        .collect();
    // Every node listed has its row, earning or not.
    let mut table = EarningsTable {
        months: starts
            .iter()
            .map(|d| d.format("%Y-%m").to_string())
            .collect(),
        nodes: nodes
            .iter()
            .map(|n| (n.name.clone(), vec![Money::ZERO; starts.len()]))
            .collect(),
        totals: vec![Money::ZERO; starts.len()],
    };
    for (i, start) in starts.iter().enumerate() {
        let Some(end) = start.checked_add_months(Months::new(1)) else {
            continue;
        };
        for owner in &owners {
            let mut path = format!("/api/v1/earnings?from={start}&to={end}");
            if let Some(o) = owner {
                path.push_str(&format!("&user_id={}", enc(o)));
            }
            let e: Earnings = api.get(&path).await.map_err(|f| ctx.failed(f))?;
            for n in e.nodes {
                let row = table
                    .nodes
                    .entry(n.node)
                    .or_insert_with(|| vec![Money::ZERO; starts.len()]);
                row[i] = row[i].checked_add(n.earned).unwrap_or(row[i]);
                table.totals[i] = table.totals[i]
                    .checked_add(n.earned)
                    .unwrap_or(table.totals[i]);
            }
        }
    }
    Ok(table)
}

fn earnings_table(l: Lang, t: &EarningsTable) -> Markup {
    html! {
        @if t.nodes.is_empty() {
            p.empty { (l.t("No nodes, no earnings.", "没有节点，也没有收益。")) }
        } @else {
            div.scroll {
                table.earnings {
                    thead { tr {
                        th scope="col" { (l.t("Node", "节点")) }
                        @for m in &t.months { th scope="col" { (m) } }
                    } }
                    tbody {
                        @for (node, earned) in &t.nodes {
                            tr data-node=(node) {
                                th scope="row" { (raw(node)) }
                                @for e in earned { td { (money(*e)) } }
                            }
                        }
                    }
                    tfoot { tr {
                        th scope="row" { (l.t("Total", "合计")) }
                        @for e in &t.totals { td { (money(*e)) } }
                    } }
                }
            }
        }
    }
}

/// `http(s)://HOST` as the browser reached this page: where agents should find the server.
fn server_url(ctx: &Ctx, headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1:8080");
    let scheme = if ctx.secure { "https" } else { "http" };
    format!("{scheme}://{host}")
}

fn join_note(l: Lang, t: &JoinToken, server: &str) -> Markup {
    let command = format!("gpurent agent --server {server} --join-token {}", t.token);
    html! {
        div.alert.ok role="status" data-field="join-token" {
            p { strong { (l.t("Your join token. Copy it now: it is not shown again.", "您的加入令牌。请立即复制：它不会再次显示。")) } }
            p.secret { code data-field="token" { (t.token) } " "
                button.small.secondary type="button" data-copy=(t.token) { (l.t("Copy", "复制")) } }
            p { (l.t("On the GPU host, run:", "在 GPU 主机上运行：")) }
            p.secret { code data-field="join-command" { (command) } " "
                button.small.secondary type="button" data-copy=(command) { (l.t("Copy", "复制")) } }
            p.hint { (l.t("Valid until", "有效期至")) " " (time(t.expires_at)) }
        }
    }
}

fn done_note(l: Lang, done: &str, node: Option<&str>) -> Markup {
    let text = match done {
        "cordon" => l.t(
            "Cordoned: no new work lands on the node.",
            "已停止调度：节点不再接收新任务。",
        ),
        "drain" => l.t(
            "Drained: its work moves to other nodes.",
            "已排空：其上的任务正迁移到其他节点。",
        ),
        "uncordon" => l.t("The node takes new work again.", "节点已恢复接收新任务。"),
        _ => return html! {},
    };
    html! {
        div.alert.ok role="status" {
            @if let Some(n) = node { (raw(n)) " · " }
            (text)
        }
    }
}

fn node_status(l: Lang, word: &str) -> Markup {
    let shown = match word {
        "ready" => l.t("ready", "就绪"),
        "lost" => l.t("lost", "失联"),
        "unreachable" => l.t("unreachable", "无法连接"),
        "unhealthy" => l.t("unhealthy", "不健康"),
        "draining" => l.t("draining", "已停止调度"),
        "unverified" => l.t("unverified", "未通过验证"),
        _ => "",
    };
    html! {
        span.status data-field="node-status" data-status=(word) {
            @if shown.is_empty() { (raw(word)) } @else { (shown) }
        }
    }
}

fn gpu_status(l: Lang, word: &str) -> Markup {
    let shown = match word {
        "free" => l.t("free", "空闲"),
        "allocated" => l.t("allocated", "已分配"),
        "shared" => l.t("shared", "共享中"),
        "missing" => l.t("missing", "缺失"),
        _ => "",
    };
    html! { @if shown.is_empty() { (raw(word)) } @else { (shown) } }
}

fn health_rule(l: Lang, rule: &str) -> Markup {
    // ECC and XID are the driver's own names: kept as they are in every language.
    html! {
        @match rule {
            "temperature" => { (l.t("temperature", "温度")) }
            "vram" => { (l.t("memory", "显存")) }
            "ecc" => { span translate="no" { "ECC" } " " (l.t("errors", "错误")) }
            "xid" => { span translate="no" { "XID" } " " (l.t("errors", "错误")) }
            "lost" => { (l.t("GPU lost", "GPU 失联")) }
            _ => { (raw(rule)) }
        }
    }
}

fn node_card(ctx: &Ctx, n: &Node) -> Markup {
    let l = ctx.lang;
    let path = enc(&n.id);
    html! {
        article.card.node data-node-id=(n.id) aria-labelledby={ "node-" (n.id) } {
            h3 id={ "node-" (n.id) } { (raw(&n.name)) " " (node_status(l, &n.status)) }
            dl.facts {
                dt { (l.t("Id", "编号")) } dd { (raw(&n.id)) }
                @if ctx.role() == Some(Role::Admin) {
                    dt { (l.t("Owner", "所有者")) } dd { @if let Some(o) = &n.owner_id { (raw(o)) } @else { "—" } }
                }
                dt { (l.t("Executor", "执行器")) } dd {
                    (raw(&n.executor))
                    @if !n.isolated { " " span.warn { (l.t("(instances not isolated)", "（实例未隔离）")) } }
                    @else if n.shared_network { " " span.warn title=(l.t("its instances reach the node's loopback services and each other's ports", "其实例可访问节点的回环服务和彼此的端口")) { (l.t("(network: shared)", "（网络：共享）")) } }
                }
                dt { (l.t("GPU backend", "GPU 后端")) } dd {
                    (raw(&n.gpu_backend))
                    @if let Some(d) = &n.driver_version { " · " (l.t("driver", "驱动")) " " (raw(d)) }
                    @if let Some(c) = &n.cuda_version { " · " (raw(&format!("CUDA {c}"))) }
                }
                @if n.cpus.is_some() || n.memory_mb.is_some() {
                    dt { (l.t("Cores and memory", "CPU 核数与内存")) } dd data-field="capacity" {
                        @if let Some(c) = n.cpus { (c) " " (l.t("cores", "核")) }
                        @if let Some(mb) = n.memory_mb { " · " (mb / 1024) " GiB" }
                    }
                }
                dt { (l.t("Last heard from", "最近心跳")) } dd { (time(n.last_seen_at)) }
                dt { (l.t("Verification", "主机验证")) } dd data-field="verification" {
                    @match &n.verification {
                        None => { span.muted { (l.t("not reported yet", "尚未上报")) } }
                        Some(v) if v.ok => { span.ok { (l.t("passed", "已通过")) } }
                        Some(v) => {
                            span.error { (l.t("failed", "未通过")) }
                            ul.plain { @for c in v.checks.iter().filter(|c| !c.ok) {
                                li { (raw(&c.name)) " " (raw(&c.detail)) }
                            } }
                        }
                    }
                }
                dt { (l.t("Health", "健康状况")) } dd data-field="health" {
                    @if n.health.is_empty() {
                        span.ok { (l.t("healthy", "健康")) }
                    } @else {
                        ul.plain { @for h in &n.health {
                            li.error { (health_rule(l, &h.rule)) " " (raw(&h.gpu_uuid)) " " (raw(&h.detail)) }
                        } }
                    }
                }
            }
            @if !n.gpus.is_empty() { (gpu_table(l, &n.gpus)) }
            div.actions {
                @if n.status != "draining" && n.status != "lost" {
                    form method="post" action={ "/nodes/" (path) "/cordon" }
                        data-confirm=(l.t("Cordon this node? No new work lands on it; what runs there keeps running.", "确定停止调度此节点？新任务不会再分配到此节点，正在运行的任务继续运行。")) {
                        (ctx.csrf_field())
                        button.small.secondary type="submit" data-action="cordon" { (l.t("Cordon", "停止调度")) }
                    }
                }
                @if n.status != "lost" {
                    form method="post" action={ "/nodes/" (path) "/drain" }
                        data-confirm=(l.t("Drain this node? Its instances are moved to other nodes.", "确定排空此节点？其上的实例将迁移到其他节点。")) {
                        (ctx.csrf_field())
                        button.small.danger type="submit" data-action="drain" { (l.t("Drain", "排空")) }
                    }
                }
                @if n.status == "draining" {
                    form method="post" action={ "/nodes/" (path) "/uncordon" } {
                        (ctx.csrf_field())
                        button.small type="submit" data-action="uncordon" { (l.t("Uncordon", "恢复调度")) }
                    }
                }
            }
        }
    }
}

/// `12.3 W` from milliwatts, without a float.
fn watts(mw: u64) -> String {
    format!("{}.{} W", mw / 1000, (mw % 1000) / 100)
}

fn gpu_table(l: Lang, gpus: &[Gpu]) -> Markup {
    html! {
        div.scroll {
            table.gpus {
                thead { tr {
                    th scope="col" { (l.t("GPU", "GPU")) }
                    th scope="col" { (l.t("Allocation", "分配")) }
                    th scope="col" { (l.t("Utilisation", "利用率")) }
                    th scope="col" { (l.t("Memory used / total", "显存已用 / 总量")) }
                    th scope="col" { (l.t("Temperature", "温度")) }
                    th scope="col" { (l.t("Power", "功耗")) }
                } }
                tbody {
                    @for g in gpus {
                        tr data-gpu-uuid=(g.uuid) {
                            th scope="row" { (raw(&g.model)) br; small.muted { (raw(&g.uuid)) } }
                            td data-label=(l.t("Allocation", "分配")) { (gpu_status(l, &g.status)) }
                            @match &g.telemetry {
                                Some(t) if t.lost => {
                                    td.error colspan="4" { (l.t("The GPU does not answer.", "GPU 无响应。")) }
                                }
                                Some(t) => {
                                    td data-field="utilization" data-label=(l.t("Utilisation", "利用率")) {
                                        meter min="0" max="100" value=(t.utilization_pct) aria-label=(l.t("Utilisation", "利用率")) {}
                                        " " (t.utilization_pct) "%"
                                    }
                                    td data-field="memory" data-label=(l.t("Memory", "显存")) {
                                        (t.memory_used_mb) " / "
                                        @if t.memory_total_mb > 0 { (t.memory_total_mb) } @else { (u64::from(g.vram_gb) * 1024) }
                                        " MiB"
                                    }
                                    td data-field="temperature" data-label=(l.t("Temperature", "温度")) { (t.temperature_c) " °C" }
                                    td data-field="power" data-label=(l.t("Power", "功耗")) { (watts(t.power_mw)) }
                                }
                                None => {
                                    td.muted colspan="4" { (l.t("No figures yet.", "暂无数据。")) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What a node form does: its word in `?done=` and the API's route.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NodeAction {
    Cordon,
    Drain,
    Uncordon,
}

impl NodeAction {
    fn word(self) -> &'static str {
        match self {
            NodeAction::Cordon => "cordon",
            NodeAction::Drain => "drain",
            NodeAction::Uncordon => "uncordon",
        }
    }
}

async fn act(
    state: &AppState,
    ctx: &Ctx,
    node: &str,
    action: NodeAction,
) -> Result<Response, PageError> {
    let api = ctx.api(state)?;
    let path = format!("/api/v1/nodes/{}/{}", enc(node), action.word());
    let done: NodeScheduled = api
        .call(Method::POST, &path, &serde_json::json!({}))
        .await
        .map_err(|f| ctx.failed(f))?;
    Ok(Redirect::to(&format!(
        "/nodes?done={}&node={}",
        action.word(),
        enc(&done.node_id)
    ))
    .into_response())
}

pub(crate) async fn cordon(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(node): Path<String>,
) -> Result<Response, PageError> {
    act(&state, &ctx, &node, NodeAction::Cordon).await
}

pub(crate) async fn drain(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(node): Path<String>,
) -> Result<Response, PageError> {
    act(&state, &ctx, &node, NodeAction::Drain).await
}

pub(crate) async fn uncordon(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(node): Path<String>,
) -> Result<Response, PageError> {
    act(&state, &ctx, &node, NodeAction::Uncordon).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watts_from_milliwatts() {
        assert_eq!(watts(0), "0.0 W");
        assert_eq!(watts(312_450), "312.4 W");
    }

    #[test]
    fn a_month_is_yyyy_mm() {
        assert_eq!(month_start("2026-02"), NaiveDate::from_ymd_opt(2026, 2, 1));
        assert_eq!(month_start("2026-2"), None);
        assert_eq!(month_start("2026-13"), None);
        assert_eq!(month_start("soon"), None);
    }
}
