//! `/billing`: the viewer's balance, holds and earnings, their monthly budget (`budget_view.rs`),
//! what they were charged per day (a bar chart and its table) and per reservation in a date
//! range, and a month's invoice with its CSV (the API's own, as `gpurent invoice MONTH --csv`
//! writes it).

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{Datelike, Duration, NaiveDate};
use gpurent_types::api::{format_size, Balance, DayUsage, Invoice, Usage};
use gpurent_types::{Money, Role};
use maud::{html, Markup};
use serde::Deserialize;

use super::budget_view::{self, Refused, Whose};
use crate::console::api::{enc, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, maybe_time, money, raw, Ctx, PageError};
use crate::state::AppState;

/// The days of usage shown when the form does not say: the last 30, today included.
const DEFAULT_DAYS: i64 = 30;
/// The longest range the chart draws a bar per day for.
const MAX_DAYS: i64 = 366;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct BillingQuery {
    /// First day of the usage range, `YYYY-MM-DD` (UTC).
    from: Option<String>,
    /// Last day of the usage range, included.
    to: Option<String>,
    /// The invoice's month, `YYYY-MM`.
    month: Option<String>,
    /// What the form before this page did: `budget`, `budget-removed`.
    done: Option<String>,
}

/// The usage range the query asks for, or why it cannot be used (the default range is shown
/// then).
fn range(today: NaiveDate, q: &BillingQuery) -> (NaiveDate, NaiveDate, Option<Failure>) {
    let default = (today - Duration::days(DEFAULT_DAYS - 1), today);
    let parse = |name: &str, text: &Option<String>, or: NaiveDate| match text
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        None => Ok(or),
        Some(t) => NaiveDate::parse_from_str(t, "%Y-%m-%d")
            .map_err(|_| format!("{name}: {t:?} is not a date (YYYY-MM-DD)")),
    };
    let checked = parse("from", &q.from, default.0).and_then(|from| {
        let to = parse("to", &q.to, default.1)?;
        if to < from {
            return Err("to is before from".to_owned());
        }
        if (to - from).num_days() >= MAX_DAYS {
            return Err(format!("the range is longer than {MAX_DAYS} days"));
        }
        Ok((from, to))
    });
    match checked {
        Ok((from, to)) => (from, to, None),
        Err(message) => (
            default.0,
            default.1,
            Some(Failure {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code: "validation".into(),
                message,
            }),
        ),
    }
}

pub(crate) async fn page(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<BillingQuery>,
) -> Result<Response, PageError> {
    render(&state, &ctx, &q, None).await
}

/// The page, with a refused budget form shown again in its section.
pub(crate) async fn render(
    state: &AppState,
    ctx: &Ctx,
    q: &BillingQuery,
    refused: Option<&Refused>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(state)?;
    let now = state.now();
    let (from, to, range_failure) = range(now.date_naive(), q);
    let month = q
        .month
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map_or_else(|| now.format("%Y-%m").to_string(), str::to_owned);

    let balance: Balance = api
        .get("/api/v1/balance")
        .await
        .map_err(|f| ctx.failed(f))?;
    let usage: Usage = api
        .get(&format!(
            "/api/v1/usage?from={from}&to={}",
            to + Duration::days(1)
        ))
        .await
        .map_err(|f| ctx.failed(f))?;
    // A month the API does not take is said above its picker; the rest of the page stands.
    let invoice = api
        .get::<Invoice>(&format!("/api/v1/invoices/{}", enc(&month)))
        .await;
    if let Err(f) = &invoice {
        if f.status.is_server_error() {
            return Err(ctx.failed(f.clone()));
        }
    }
    let budget = budget_view::fetch(&api, Whose::Own).await;
    if let Err(f) = &budget {
        if f.status.is_server_error() {
            return Err(ctx.failed(f.clone()));
        }
    }
    let earner = matches!(ctx.role(), Some(Role::Host | Role::Admin));
    let days = every_day(from, to, &usage.days);

    let body = html! {
        @if let Some(note) = q.done.as_deref().and_then(|d| budget_view::done_note(l, d)) { (note) }
        div.tiles {
            div.tile { span.muted { (l.t("Balance", "余额")) } span.n data-field="balance" { (money(balance.balance)) } }
            div.tile { span.muted { (l.t("Held for your instances", "为您的实例预扣")) } span.n data-field="held" { (money(balance.held)) } }
            @if earner || balance.earnings != Money::ZERO {
                div.tile { span.muted { (l.t("Earned by your nodes", "您的节点收益")) } span.n data-field="earnings" { (money(balance.earnings)) } }
            }
        }
        (budget_view::section(ctx, &budget_view::Section {
            whose: Whose::Own,
            budget: &budget,
            may_set: true,
            refused,
        }))
        section aria-labelledby="usage-h" {
            h2 id="usage-h" { (l.t("Usage", "用量")) }
            @if let Some(f) = &range_failure { (alert(l, f)) }
            form.card.range method="get" action="/billing" {
                div.fields {
                    div {
                        label for="from" { (l.t("From", "开始日期")) }
                        input id="from" name="from" type="date" value=(from) required;
                    }
                    div {
                        label for="to" { (l.t("To (included)", "结束日期（含）")) }
                        input id="to" name="to" type="date" value=(to) required;
                    }
                    input type="hidden" name="month" value=(month);
                    div { button type="submit" { (l.t("Show", "显示")) } }
                }
                p.hint { (l.t("Days are UTC.", "日期按 UTC 计算。")) }
            }
            p { (l.t("Charged in this range:", "此期间扣费：")) " " strong data-field="usage-total" { (money(usage.total)) } }
            (chart(l, &days))
            details {
                summary { (l.t("The same as a table", "以表格查看")) }
                div.scroll {
                    table.days {
                        thead { tr {
                            th scope="col" { (l.t("Day", "日期")) }
                            th scope="col" { (l.t("Charged", "扣费")) }
                        } }
                        tbody {
                            @for d in &days {
                                tr data-date=(d.date) { th scope="row" { (d.date) } td { (money(d.charged)) } }
                            }
                        }
                    }
                }
            }
            h3 { (l.t("Per instance", "按实例")) }
            @if usage.reservations.is_empty() {
                p.empty { (l.t("No charges in this range.", "此期间没有扣费。")) }
            } @else {
                div.scroll {
                    table.charges {
                        thead { tr {
                            th scope="col" { (l.t("Instance", "实例")) }
                            th scope="col" { (l.t("Charged", "扣费")) }
                        } }
                        tbody {
                            @for r in usage.reservations.iter().take(ROWS) {
                                tr data-reservation-id=(r.reservation_id) {
                                    th scope="row" { a href={ "/instances/" (enc(&r.reservation_id)) } { (raw(&r.reservation_id)) } }
                                    td { (money(r.charged)) }
                                }
                            }
                        }
                    }
                }
                @if usage.reservations.len() > ROWS { (more(l, usage.reservations.len())) }
            }
            @if !usage.volumes.is_empty() {
                h3 { (l.t("Per volume", "按存储卷")) }
                div.scroll {
                    table.charges {
                        thead { tr {
                            th scope="col" { (l.t("Volume", "存储卷")) }
                            th scope="col" { (l.t("Charged", "扣费")) }
                        } }
                        tbody {
                            @for v in usage.volumes.iter().take(ROWS) {
                                tr data-volume-id=(v.volume_id) {
                                    th scope="row" { (raw(&v.name)) }
                                    td { (money(v.charged)) }
                                }
                            }
                        }
                    }
                }
                @if usage.volumes.len() > ROWS { (more(l, usage.volumes.len())) }
            }
        }
        section aria-labelledby="invoice-h" {
            h2 id="invoice-h" { (l.t("Monthly invoice", "月度账单")) }
            form.card.range method="get" action="/billing" {
                div.fields {
                    div {
                        label for="month" { (l.t("Month (UTC)", "月份（UTC）")) }
                        input id="month" name="month" type="month" value=(month) required;
                    }
                    input type="hidden" name="from" value=(from);
                    input type="hidden" name="to" value=(to);
                    div { button type="submit" { (l.t("Show", "显示")) } }
                }
            }
            @match &invoice {
                Ok(invoice) => { (invoice_table(l, invoice)) }
                Err(f) => { (alert(l, f)) }
            }
        }
    };
    let status = refused.map_or(StatusCode::OK, |r| r.failure.status);
    Ok(ctx.page_with_status(status, l.t("Billing", "账单"), body))
}

/// Rows of a list shown on the page; the totals count them all, and the CSV has every line.
const ROWS: usize = 200;

/// Said under a list cut at [`ROWS`].
fn more(l: Lang, all: usize) -> Markup {
    html! {
        p.hint {
            (l.t("The first", "仅显示前")) " " (ROWS) " " (l.t("of", "条，共")) " " (all)
            (l.t("; the total counts them all and the CSV download lists every one.", " 条；合计包含全部，CSV 下载列出每一条。"))
        }
    }
}

/// Every day of the range, with what was charged on it (nothing: zero).
fn every_day(from: NaiveDate, to: NaiveDate, charged: &[DayUsage]) -> Vec<DayUsage> {
    from.iter_days()
        .take_while(|d| *d <= to)
        .map(|d| {
            let date = d.format("%Y-%m-%d").to_string();
            let charged = charged
                .iter()
                .find(|c| c.date == date)
                .map_or(Money::ZERO, |c| c.charged);
            DayUsage { date, charged }
        })
        .collect()
}

/// The drawing's size in its own units: stretched to the page's width and a fixed height by
/// the stylesheet, so its labels are HTML under it, never squeezed text.
const CHART_W: i64 = 720;
const CHART_H: i64 = 160;
const CHART_TOP: i64 = 4;

/// A bar per day, as tall as its charge against the range's largest (integers only: money
/// never becomes a float).
fn chart(l: Lang, days: &[DayUsage]) -> Markup {
    let max = days
        .iter()
        .map(|d| d.charged.micros())
        .max()
        .unwrap_or(0)
        .max(1);
    let n = i64::try_from(days.len()).unwrap_or(1).max(1);
    let plot_h = CHART_H - CHART_TOP;
    let slot = CHART_W / n;
    let bar = (slot * 3 / 4).max(1);
    let top_label = days.iter().map(|d| d.charged).max().unwrap_or(Money::ZERO);
    let label = l.t("Charged per day (UTC)", "每日扣费（UTC）");
    let currency = crate::console::layout::currency();
    let bars: Vec<(i64, i64, &DayUsage)> = days
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let i = i64::try_from(i).unwrap_or(0);
            let micros = i128::from(d.charged.micros().max(0));
            let h = i64::try_from(micros * i128::from(plot_h) / i128::from(max)).unwrap_or(plot_h);
            // A day with a charge too small to see still gets a sliver.
            let h = if micros > 0 { h.max(1) } else { 0 };
            (i * slot + (slot - bar) / 2, h, d)
        })
        .collect();
    let first = days.first().map(|d| d.date.as_str()).unwrap_or("");
    let last = days.last().map(|d| d.date.as_str()).unwrap_or("");
    html! {
        figure.chart {
            svg viewBox={ "0 0 " (CHART_W) " " (CHART_H) } role="img" aria-labelledby="usage-chart-t" preserveAspectRatio="none" {
                title id="usage-chart-t" { (label) }
                line.axis x1="0" y1=(CHART_TOP) x2=(CHART_W) y2=(CHART_TOP) vector-effect="non-scaling-stroke" {}
                @for (x, h, d) in &bars {
                    rect.bar x=(x) y=(CHART_H - h) width=(bar) height=(h) {
                        title { (d.date) ": " (d.charged) " " (currency) }
                    }
                }
            }
            div.chart-scale {
                span { (first) }
                span { (l.t("top line:", "顶线：")) " " (money(top_label)) }
                span { (last) }
            }
            figcaption.muted { (label) }
        }
    }
}

fn invoice_table(l: Lang, invoice: &Invoice) -> Markup {
    html! {
        p {
            (l.t("Invoice number", "账单编号")) " " (raw(&invoice.number)) " · "
            (raw(&invoice.user_name)) " · " (invoice.month)
        }
        @if invoice.lines.is_empty() && invoice.storage.is_empty() {
            p.empty { (l.t("No charges this month.", "本月没有扣费。")) }
        } @else if !invoice.lines.is_empty() {
            div.scroll {
                table.invoice {
                    thead { tr {
                        th scope="col" { (l.t("Instance", "实例")) }
                        th scope="col" { (l.t("GPUs", "GPU")) }
                        th scope="col" { (l.t("Tier", "计费档位")) }
                        th scope="col" { (l.t("Price per hour", "每小时价格")) }
                        th scope="col" { (l.t("Started", "开始时间")) }
                        th scope="col" { (l.t("Ended", "结束时间")) }
                        th scope="col" { (l.t("Amount", "金额")) }
                    } }
                    tbody {
                        @for line in invoice.lines.iter().take(ROWS) {
                            tr data-reservation-id=(line.reservation_id) {
                                th scope="row" { a href={ "/instances/" (enc(&line.reservation_id)) } { (raw(&line.reservation_id)) } }
                                td { @match line.vram_gb {
                                    Some(gb) => { (gb) " GB · " (raw(&line.gpu_type)) }
                                    None => { (line.gpu_count) " × " (raw(&line.gpu_type)) }
                                } }
                                td { (raw(line.tier.as_str())) }
                                td { (money(line.price_per_hour)) }
                                td { (maybe_time(line.started_at)) }
                                td { (maybe_time(line.ended_at)) }
                                td { (money(line.amount)) }
                            }
                        }
                    }
                    tfoot { tr {
                        th scope="row" colspan="6" { (l.t("Total", "合计")) }
                        td data-field="invoice-total" { (money(invoice.total)) }
                    } }
                }
            }
        }
        @if invoice.lines.len() > ROWS { (more(l, invoice.lines.len())) }
        @if !invoice.storage.is_empty() {
            div.scroll {
                table.invoice {
                    thead { tr {
                        th scope="col" { (l.t("Volume", "存储卷")) }
                        th scope="col" { (l.t("Size", "大小")) }
                        th scope="col" { (l.t("Price per GB-month", "每 GB 每月价格")) }
                        th scope="col" { (l.t("Made", "创建时间")) }
                        th scope="col" { (l.t("Removed", "删除时间")) }
                        th scope="col" { (l.t("Amount", "金额")) }
                    } }
                    tbody {
                        @for line in invoice.storage.iter().take(ROWS) {
                            tr data-volume-id=(line.volume_id) {
                                th scope="row" { (raw(&line.name)) }
                                td { (format_size(line.size_bytes)) }
                                td { (money(line.price_per_gb_month)) }
                                td { (maybe_time(Some(line.created_at))) }
                                td { (maybe_time(line.deleted_at)) }
                                td { (money(line.amount)) }
                            }
                        }
                    }
                }
            }
            @if invoice.storage.len() > ROWS { (more(l, invoice.storage.len())) }
        }
        @if invoice.lines.is_empty() {
            p { (l.t("Total", "合计")) ": " span data-field="invoice-total" { (money(invoice.total)) } }
        }
        p { a.button href={ "/billing/invoice.csv?month=" (enc(&invoice.month)) } download { (l.t("Download CSV", "下载 CSV")) } }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct CsvQuery {
    month: String,
}

/// The month's invoice as the API writes it for `gpurent invoice MONTH --csv`, as a download.
pub(crate) async fn invoice_csv(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<CsvQuery>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let month = if q.month.trim().is_empty() {
        state.now().format("%Y-%m").to_string()
    } else {
        q.month.trim().to_owned()
    };
    let path = format!("/api/v1/invoices/{}?format=csv", enc(&month));
    let (headers, bytes) = api
        .send(Method::GET, &path, None)
        .await
        .map_err(|f| ctx.failed(f))?;
    let mut response = bytes.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        headers
            .get(header::CONTENT_TYPE)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("text/csv; charset=utf-8")),
    );
    let name = format!("attachment; filename=\"invoice-{}.csv\"", month_of(&month));
    h.insert(
        header::CONTENT_DISPOSITION,
        headers
            .get(header::CONTENT_DISPOSITION)
            .cloned()
            .or_else(|| HeaderValue::from_str(&name).ok())
            .unwrap_or_else(|| HeaderValue::from_static("attachment")),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `YYYY-MM` checked (the API took it), for a file name.
fn month_of(month: &str) -> String {
    NaiveDate::parse_from_str(&format!("{month}-01"), "%Y-%m-%d")
        .map(|d| format!("{:04}-{:02}", d.year(), d.month()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn the_range_defaults_to_the_last_30_days_and_refuses_nonsense() {
        let today = day("2026-03-10");
        let (from, to, f) = range(today, &BillingQuery::default());
        assert_eq!((from, to), (day("2026-02-09"), today));
        assert!(f.is_none());
        let q = BillingQuery {
            from: Some("2026-03-01".into()),
            to: Some("2026-03-05".into()),
            ..BillingQuery::default()
        };
        let (from, to, f) = range(today, &q);
        assert_eq!((from, to), (day("2026-03-01"), day("2026-03-05")));
        assert!(f.is_none());
        let backwards = BillingQuery {
            from: Some("2026-03-05".into()),
            to: Some("2026-03-01".into()),
            ..BillingQuery::default()
        };
        let (from, _, f) = range(today, &backwards);
        assert_eq!(from, day("2026-02-09"));
        assert_eq!(f.unwrap().message, "to is before from");
        let bad = BillingQuery {
            from: Some("March".into()),
            ..BillingQuery::default()
        };
        assert!(range(today, &bad).2.unwrap().message.contains("not a date"));
    }

    #[test]
    fn every_day_of_the_range_has_a_bar() {
        let charged = [DayUsage {
            date: "2026-03-02".into(),
            charged: Money::units(3),
        }];
        let days = every_day(day("2026-03-01"), day("2026-03-03"), &charged);
        let got: Vec<(&str, Money)> = days.iter().map(|d| (d.date.as_str(), d.charged)).collect();
        assert_eq!(
            got,
            [
                ("2026-03-01", Money::ZERO),
                ("2026-03-02", Money::units(3)),
                ("2026-03-03", Money::ZERO)
            ]
        );
        let svg = chart(Lang::En, &days).into_string();
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains(&format!("height=\"{}\"", CHART_H - CHART_TOP)));
        assert!(svg.contains("height=\"0\""));
    }
}
