//! `/admin/reports`: the daily report of a UTC day with its VRAM heat map and timeline (the
//! SVGs `gpurent report daily` writes, served by this module as images) and the tables of the
//! same numbers, the weekly comparison of the price tiers, and `/admin/ledger`: the ledger check.

use axum::extract::{Query, State};
use axum::response::Response;
use gpurent_types::api::LedgerReport;
use gpurent_types::report::{DailyReport, TierUsage, WeeklyReport};
use maud::{html, Markup};
use serde::Deserialize;

use super::admin::subnav;
use crate::console::api::{enc, Failure};
use crate::console::charts::svg_response;
use crate::console::lang::Lang;
use crate::console::layout::{alert, money, raw, status, time, Ctx, PageError};
use crate::report::plot::{self, Chart};
use crate::state::AppState;

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct ReportQuery {
    date: String,
    week: String,
}

fn pct(p: Option<f64>) -> Markup {
    match p {
        Some(p) => html! { (format!("{p:.1}")) " %" },
        None => html! { "—" },
    }
}

pub(crate) async fn page(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<ReportQuery>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?;
    let date = match q.date.trim() {
        "" => state.now().format("%Y-%m-%d").to_string(),
        d => d.to_owned(),
    };
    let daily = crate::console::report_cache::daily(&state, &api, &date).await;
    let weekly_path = match q.week.trim() {
        "" => "/api/v1/reports/weekly".to_owned(),
        w => format!("/api/v1/reports/weekly?week={}", enc(w)),
    };
    let weekly: Result<WeeklyReport, Failure> = api.get(&weekly_path).await;
    // The week shown, in its field: the API's default (the last whole week) when none was asked.
    let week = match q.week.trim() {
        "" => weekly
            .as_ref()
            .ok()
            .and_then(|w| w.week.clone())
            .unwrap_or_default(),
        w => w.to_owned(),
    };
    let body = html! {
        (subnav(l, "/admin/reports"))
        form.card method="get" action="/admin/reports" data-form="report" {
            div.grid {
                div {
                    label for="r-date" { (l.t("Day (UTC)", "日期（UTC）")) }
                    input id="r-date" name="date" type="date" value=(date);
                }
                div {
                    label for="r-week" { (l.t("Week (for the tier comparison)", "周（用于档位对比）")) }
                    input id="r-week" name="week" type="week" value=(week) placeholder="2026-W09";
                }
            }
            button type="submit" { (l.t("Show", "查看")) }
        }
        @match &daily {
            Err(f) => { h2 { (l.t("Daily report", "日报")) } (alert(l, f)) }
            Ok(r) => { (daily_report(l, r)) }
        }
        @match &weekly {
            Err(f) => { h2 { (l.t("The tiers compared", "档位对比")) } (alert(l, f)) }
            Ok(w) => { (weekly_report(l, w)) }
        }
    };
    Ok(ctx.page(l.t("Reports", "报表"), body))
}

fn daily_report(l: Lang, r: &DailyReport) -> Markup {
    let t = &r.totals;
    let date = r.date.to_string();
    html! {
        section aria-labelledby="day-h" data-report="daily" data-date=(date) {
            h2 id="day-h" { (l.t("Daily report", "日报")) " " (raw(&date)) " (UTC)" }
            dl.facts data-field="totals" {
                dt { (l.t("GPUs", "GPU 数")) } dd { (t.gpus) }
                dt { (l.t("GPU-hours", "GPU 小时")) } dd { (t.gpu_hours) }
                dt { (l.t("VRAM GB-hours", "显存 GB 小时")) } dd { (t.vram_gb_hours) }
                dt { (l.t("Allocated", "分配率")) } dd { (pct(Some(t.allocation_pct))) }
                dt { (l.t("Utilisation", "利用率")) } dd { (pct(t.utilization_pct)) }
                dt { (l.t("Revenue", "收入")) } dd data-field="revenue" { (money(t.revenue)) }
                dt { (l.t("Hosts' share", "主机方分成")) } dd { (money(t.host_earnings)) }
            }
            h3 { (l.t("VRAM heat map", "显存热力图")) }
            figure.chart {
                img src={ "/admin/reports/heatmap.svg?date=" (enc(&date)) } data-chart="heatmap"
                    alt=(l.t("VRAM used per GPU and hour; the same numbers are in the table below.", "每块 GPU 每小时的显存使用率；下表为相同数据。"))
                    loading="lazy";
                figcaption.hint { (l.t("Darker is fuller; grey: no samples. Hours in UTC.", "颜色越深占用越高；灰色表示无采样。时间为 UTC。")) }
            }
            (heat_table(l, r))
            h3 { (l.t("Timeline", "时间线")) }
            figure.chart {
                img src={ "/admin/reports/timeline.svg?date=" (enc(&date)) } data-chart="timeline"
                    alt=(l.t("The reservations on each GPU over the day; the same are in the table below.", "当天每块 GPU 上的预订；下表为相同数据。"))
                    loading="lazy";
            }
            (timeline_table(l, r))
            h3 { (l.t("Tenants", "租户")) }
            div.scroll { table data-table="tenants" {
                thead { tr {
                    th scope="col" { (l.t("Tenant", "租户")) }
                    th scope="col" { (l.t("Reservations", "预订数")) }
                    th scope="col" { (l.t("GPU-hours", "GPU 小时")) }
                    th scope="col" { (l.t("VRAM GB-hours", "显存 GB 小时")) }
                    th scope="col" { (l.t("Revenue", "收入")) }
                    th scope="col" { (l.t("Utilisation", "利用率")) }
                } }
                tbody { @for u in &r.tenants { tr {
                    th scope="row" { (raw(&u.tenant)) }
                    td { (u.reservations) } td { (u.gpu_hours) } td { (u.vram_gb_hours) }
                    td { (money(u.revenue)) } td { (pct(u.utilization_pct)) }
                } } }
            } }
            h3 { (l.t("Nodes", "节点")) }
            div.scroll { table data-table="nodes" {
                thead { tr {
                    th scope="col" { (l.t("Node", "节点")) }
                    th scope="col" { (l.t("GPUs", "GPU 数")) }
                    th scope="col" { (l.t("GPU-hours", "GPU 小时")) }
                    th scope="col" { (l.t("Revenue", "收入")) }
                    th scope="col" { (l.t("Hosts' share", "主机方分成")) }
                    th scope="col" { (l.t("Allocated", "分配率")) }
                    th scope="col" { (l.t("Utilisation", "利用率")) }
                } }
                tbody { @for n in &r.nodes { tr {
                    th scope="row" { (raw(&n.node)) }
                    td { (n.gpus) } td { (n.gpu_hours) } td { (money(n.revenue)) }
                    td { (money(n.host_earnings)) } td { (pct(Some(n.allocation_pct))) }
                    td { (pct(n.utilization_pct)) }
                } } }
            } }
        }
    }
}

/// The heat map's numbers: VRAM used per GPU and hour, percent of the GPU's memory.
fn heat_table(l: Lang, r: &DailyReport) -> Markup {
    html! {
        details {
            summary { (l.t("The heat map as a table (percent of memory used)", "热力图数据表（显存使用百分比）")) }
            div.scroll { table.heat data-table="heatmap" {
                thead { tr {
                    th scope="col" { (l.t("GPU", "GPU")) }
                    @for h in 0..24 { th scope="col" { (format!("{h:02}")) } }
                } }
                tbody { @for g in &r.gpus { tr {
                    th scope="row" { (raw(&format!("{} #{}", g.node, g.index))) }
                    @for h in &g.hours {
                        td { (used_pct(h.used_mb, g.vram_mb)) }
                    }
                } } }
            } }
        }
    }
}

/// Memory used as a percent of the GPU's, as the heat map colours it; `·` without samples.
fn used_pct(used_mb: Option<u64>, vram_mb: u64) -> String {
    #[allow(clippy::cast_precision_loss)] // MiB
    used_mb.map_or_else(
        || "·".to_owned(),
        |u| format!("{:.0}", u as f64 * 100.0 / vram_mb.max(1) as f64),
    )
}

fn timeline_table(l: Lang, r: &DailyReport) -> Markup {
    html! {
        details {
            summary { (l.t("The timeline as a table", "时间线数据表")) " (" (r.timeline.len()) ")" }
            div.scroll { table data-table="timeline" {
                thead { tr {
                    th scope="col" { (l.t("Reservation", "预订")) }
                    th scope="col" { (l.t("Tenant", "租户")) }
                    th scope="col" { (l.t("Node", "节点")) }
                    th scope="col" { (l.t("Tier", "计费档位")) }
                    th scope="col" { (l.t("Status", "状态")) }
                    th scope="col" { (l.t("From", "开始")) }
                    th scope="col" { (l.t("To", "结束")) }
                } }
                tbody { @for e in &r.timeline { tr {
                    th scope="row" { a href={ "/instances/" (enc(&e.reservation_id)) } { (raw(&e.reservation_id)) } }
                    td { (raw(&e.tenant)) }
                    td { @if let Some(n) = &e.node { (raw(n)) } @else { "—" } }
                    td { (raw(e.tier.as_str())) }
                    td { (status(e.status.as_str())) }
                    td { (time(e.start)) }
                    td { (time(e.end)) @if e.ongoing { " " span.pill { (l.t("ongoing", "进行中")) } } }
                } } }
            } }
        }
    }
}

fn weekly_report(l: Lang, w: &WeeklyReport) -> Markup {
    let row = |name: Markup, t: &TierUsage| {
        html! {
            tr data-tier=[t.tier.map(|t| t.as_str())] {
                th scope="row" { (name) }
                td { (t.reservations) }
                td { (t.gpu_hours) }
                td { (money(t.charged)) }
                td { @match t.price_per_gpu_hour { Some(p) => { (money(p)) }, None => { "—" } } }
                td { (t.preemptions) }
                td { (money(t.host_earnings)) }
                td { (money(t.platform_return)) }
            }
        }
    };
    html! {
        section aria-labelledby="week-h" data-report="weekly" {
            h2 id="week-h" { (l.t("The tiers compared", "档位对比")) " "
                @if let Some(week) = &w.week { (raw(week)) } }
            p.hint { (time(w.from)) " – " (time(w.to)) }
            div.scroll { table data-table="tiers" {
                thead { tr {
                    th scope="col" { (l.t("Tier", "计费档位")) }
                    th scope="col" { (l.t("Reservations", "预订数")) }
                    th scope="col" { (l.t("GPU-hours", "GPU 小时")) }
                    th scope="col" { (l.t("Charged", "收取")) }
                    th scope="col" { (l.t("Per GPU-hour", "每 GPU 小时")) }
                    th scope="col" { (l.t("Preemptions", "被抢占")) }
                    th scope="col" { (l.t("Hosts' share", "主机方分成")) }
                    th scope="col" { (l.t("Platform's return", "平台所得")) }
                } }
                tbody {
                    @for t in &w.tiers {
                        (row(html! { (raw(t.tier.map_or("", |t| t.as_str()))) }, t))
                    }
                }
                tfoot { (row(html! { (l.t("Total", "合计")) }, &w.total)) }
            } }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ChartQuery {
    date: String,
}

/// A chart of a day's report as an SVG image: the same drawing as `gpurent report daily`.
async fn chart(
    state: &AppState,
    ctx: &Ctx,
    which: Chart,
    date: &str,
) -> Result<Response, PageError> {
    let api = ctx.api(state)?;
    let report = crate::console::report_cache::daily(state, &api, date)
        .await
        .map_err(|f| ctx.failed(f))?;
    let svg = plot::svg(which, &report).map_err(|e| PageError::internal(&e.to_string()))?;
    Ok(svg_response(svg))
}

pub(crate) async fn heatmap(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<ChartQuery>,
) -> Result<Response, PageError> {
    chart(&state, &ctx, Chart::Heatmap, &q.date).await
}

pub(crate) async fn timeline(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<ChartQuery>,
) -> Result<Response, PageError> {
    chart(&state, &ctx, Chart::Timeline, &q.date).await
}

pub(crate) async fn ledger(State(state): State<AppState>, ctx: Ctx) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?;
    let r: LedgerReport = api
        .get("/api/v1/admin/ledger-check")
        .await
        .map_err(|f| ctx.failed(f))?;
    let body = html! {
        (subnav(l, "/admin/ledger"))
        @if r.ok {
            div.alert.ok role="status" data-field="verdict" data-ok="true" {
                strong { (l.t("The books balance.", "账目平衡。")) } " "
                (l.t("Every balance equals its transfers, and all balances sum to zero.", "每个账户的余额与其转账一致，所有余额之和为零。"))
            }
        } @else {
            div.alert.error role="alert" data-field="verdict" data-ok="false" {
                strong { (l.t("The books do not balance.", "账目不平衡。")) }
            }
        }
        dl.facts {
            dt { (l.t("Transfers", "转账笔数")) } dd data-field="transfers" { (r.transfers) }
            dt { (l.t("Sum of all balances", "所有余额之和")) } dd data-field="sum" { (money(r.sum)) }
        }
        @if !r.mismatched.is_empty() {
            h2 { (l.t("Balances that differ from their transfers", "与转账不符的余额")) }
            div.scroll { table data-table="mismatched" {
                thead { tr {
                    th scope="col" { (l.t("Account", "账户")) }
                    th scope="col" { (l.t("Cached", "缓存余额")) }
                    th scope="col" { (l.t("From the transfers", "按转账计算")) }
                } }
                tbody { @for m in &r.mismatched { tr {
                    th scope="row" { (raw(&m.account)) }
                    td { (money(m.cached)) } td { (money(m.derived)) }
                } } }
            } }
        }
        @if !r.problems.is_empty() {
            h2 { (l.t("Problems", "问题")) }
            ul data-field="problems" { @for p in &r.problems { li { (raw(p)) } } }
        }
        form method="get" action="/admin/ledger" {
            button type="submit" data-action="ledger-check" { (l.t("Check again", "重新核对")) }
        }
    };
    Ok(ctx.page(l.t("Ledger check", "账本核对"), body))
}
