//! `/admin/audit`: the audit trail searched by user, resource and time (the API's filters)
//! and by action (filtered here, on each page the API gives), its signed checkpoints, and
//! `/admin/audit/verify`: the whole trail verified, with the first problem found.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, NaiveDateTime};
use gpurent_types::api::{AuditCheckpoint, AuditPage, AuditRecord, AuditVerdict};
use maud::{html, Markup};
use serde::Deserialize;

use super::admin::subnav;
use crate::console::api::{enc, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, raw, time, Ctx, PageError};
use crate::state::AppState;

/// Records per page.
const PAGE: u32 = 100;
/// Checkpoints shown: the newest.
const CHECKPOINTS: usize = 20;

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct Search {
    user: String,
    resource: String,
    action: String,
    from: String,
    to: String,
    after: u64,
}

/// A time field as RFC 3339: a browser's `datetime-local` (no zone) is taken as UTC.
fn rfc3339(text: &str) -> Option<String> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if DateTime::parse_from_rfc3339(text).is_ok() {
        return Some(text.to_owned());
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
        .map(|t| {
            t.and_utc()
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        })
        .or_else(|| Some(text.to_owned()))
}

impl Search {
    fn api_path(&self) -> String {
        let mut path = format!("/api/v1/audit?limit={PAGE}&after={}", self.after);
        for (name, value) in [
            ("user", Some(self.user.trim().to_owned())),
            ("resource", Some(self.resource.trim().to_owned())),
            ("from", rfc3339(&self.from)),
            ("to", rfc3339(&self.to)),
        ] {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                path.push_str(&format!("&{name}={}", enc(&v)));
            }
        }
        path
    }

    fn keeps(&self, r: &AuditRecord) -> bool {
        let want = self.action.trim().to_ascii_lowercase();
        want.is_empty() || r.action.to_ascii_lowercase().contains(&want)
    }

    fn next(&self, after: u64) -> String {
        format!(
            "/admin/audit?user={}&resource={}&action={}&from={}&to={}&after={after}",
            enc(self.user.trim()),
            enc(self.resource.trim()),
            enc(self.action.trim()),
            enc(self.from.trim()),
            enc(self.to.trim()),
        )
    }
}

pub(crate) async fn search(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(s): Query<Search>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?;
    let page: Result<AuditPage, Failure> = api.get(&s.api_path()).await;
    let checkpoints: Vec<AuditCheckpoint> = api
        .get("/api/v1/audit/checkpoints")
        .await
        .map_err(|f| ctx.failed(f))?;
    let failed_status = page.as_ref().err().map(|f| f.status);
    let body = html! {
        (subnav(l, "/admin/audit"))
        form.card method="get" action="/admin/audit/verify" data-form="verify" {
            p { (l.t("Check every retained record against the hash chain, the signed checkpoints and the head.", "用哈希链、签名检查点和链头校验所有保留的记录。")) }
            button type="submit" data-action="verify" { (l.t("Verify the trail", "校验审计日志")) }
        }
        h2 { (l.t("Search", "搜索")) }
        (search_form(l, &s))
        @match &page {
            Err(f) => { (alert(l, f)) }
            Ok(p) => { (records(l, &s, p)) }
        }
        (checkpoint_table(l, &checkpoints))
    };
    let status = failed_status.unwrap_or(StatusCode::OK);
    Ok(ctx.page_with_status(status, l.t("Audit trail", "审计日志"), body))
}

fn search_form(l: Lang, s: &Search) -> Markup {
    html! {
        form.card method="get" action="/admin/audit" data-form="audit-search" {
            div.grid {
                div {
                    label for="a-user" { (l.t("User", "用户")) " (" (raw("ID | node:ID")) ")" }
                    input id="a-user" name="user" type="text" value=(s.user);
                }
                div {
                    label for="a-action" { (l.t("Action contains", "操作包含")) }
                    input id="a-action" name="action" type="text" value=(s.action) placeholder="POST /api/v1/users";
                }
                div {
                    label for="a-resource" { (l.t("Resource (a path or a reservation id)", "资源（路径或预订 ID）")) }
                    input id="a-resource" name="resource" type="text" value=(s.resource);
                }
                div {
                    label for="a-from" { (l.t("From (UTC)", "起始时间（UTC）")) }
                    input id="a-from" name="from" type="datetime-local" step="1" value=(s.from);
                }
                div {
                    label for="a-to" { (l.t("Before (UTC)", "截止时间（UTC）")) }
                    input id="a-to" name="to" type="datetime-local" step="1" value=(s.to);
                }
            }
            button type="submit" { (l.t("Search", "搜索")) }
        }
    }
}

fn records(l: Lang, s: &Search, page: &AuditPage) -> Markup {
    let shown: Vec<&AuditRecord> = page.records.iter().filter(|r| s.keeps(r)).collect();
    html! {
        @if !s.action.trim().is_empty() {
            p.hint data-field="filtered" {
                (l.t("The API searches by user, resource and time; the action is matched on each page of", "API 按用户、资源和时间搜索；操作在每页"))
                " " (PAGE) " "
                (l.t("records it gives. Shown:", "条记录中匹配。本页显示："))
                " " (shown.len()) " / " (page.records.len())
            }
        }
        @if shown.is_empty() {
            p.empty { (l.t("No records match.", "没有符合条件的记录。")) }
        } @else {
            div.scroll { table data-table="audit" {
                thead { tr {
                    th scope="col" { "#" }
                    th scope="col" { (l.t("Time", "时间")) }
                    th scope="col" { (l.t("User", "用户")) }
                    th scope="col" { (l.t("Action", "操作")) }
                    th scope="col" { (l.t("Resource", "资源")) }
                    th scope="col" { (l.t("Outcome", "结果")) }
                    th scope="col" { (l.t("Client", "客户端")) }
                } }
                tbody { @for r in &shown {
                    tr data-seq=(r.seq) {
                        td { (r.seq) }
                        td { (time(r.at)) }
                        td { @if let Some(u) = &r.user_id { (raw(u)) } @else { "—" } }
                        td { (raw(&r.action)) }
                        td { (raw(&r.resource))
                            @if let Some(a) = &r.allocation { br; small { (raw(a)) } } }
                        td { (raw(&r.outcome.to_string())) }
                        td { (raw(&r.client)) }
                    }
                } }
            } }
        }
        @if let Some(next) = page.next_after {
            p { a href=(s.next(next)) data-action="next-page" { (l.t("Later records", "之后的记录")) " →" } }
        }
    }
}

fn checkpoint_table(l: Lang, all: &[AuditCheckpoint]) -> Markup {
    let newest: Vec<&AuditCheckpoint> = all.iter().rev().take(CHECKPOINTS).collect();
    html! {
        section aria-labelledby="cp-h" {
            h2 id="cp-h" { (l.t("Signed checkpoints", "签名检查点")) }
            @if newest.is_empty() {
                p.empty { (l.t("No checkpoints yet.", "还没有检查点。")) }
            } @else {
                p.hint { (l.t("The newest first; total:", "从新到旧；总数：")) " " (all.len()) }
                div.scroll { table data-table="checkpoints" {
                    thead { tr {
                        th scope="col" { (l.t("Position", "位置")) }
                        th scope="col" { (l.t("Time", "时间")) }
                        th scope="col" { (l.t("Hash", "哈希")) }
                        th scope="col" { (l.t("Signed by", "签名公钥")) }
                    } }
                    tbody { @for c in &newest {
                        tr {
                            td { (c.seq) @if c.anchor { " " span.pill { (l.t("anchor", "锚点")) } } }
                            td { (time(c.at)) }
                            td { (raw(&c.hash)) }
                            td { (raw(&c.public_key)) }
                        }
                    } }
                } }
            }
        }
    }
}

pub(crate) async fn verify(State(state): State<AppState>, ctx: Ctx) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?;
    let v: AuditVerdict = api
        .get("/api/v1/audit/verify")
        .await
        .map_err(|f| ctx.failed(f))?;
    let body = html! {
        (subnav(l, "/admin/audit"))
        @if v.ok {
            div.alert.ok role="status" data-field="verdict" data-ok="true" {
                strong { (l.t("The trail is intact.", "审计日志完好。")) }
            }
        } @else {
            div.alert.error role="alert" data-field="verdict" data-ok="false" {
                strong { (l.t("The trail was tampered with.", "审计日志已被篡改。")) }
            }
        }
        dl.facts {
            dt { (l.t("Records read", "已读取记录")) } dd data-field="records" { (v.records) }
            dt { (l.t("Signed checkpoints matched", "已匹配的签名检查点")) } dd { (v.checkpoints) }
            dt { (l.t("Server key", "服务器公钥")) } dd { (raw(&v.public_key)) }
        }
        @if let Some(bad) = &v.first_bad {
            h2 { (l.t("First problem", "第一个问题")) }
            dl.facts data-field="problem" {
                dt { (l.t("Position", "位置")) } dd { (bad.seq) }
                dt { (l.t("Problem", "问题")) } dd { (raw(&bad.problem)) }
                dt { (l.t("Detail", "详情")) } dd { (raw(&bad.message)) }
            }
            p { a href={ "/admin/audit?after=" (bad.seq.saturating_sub(1)) } { (l.t("Records from there", "从该处查看记录")) } }
        }
        p { a href="/admin/audit" { (l.t("Back to the audit trail", "返回审计日志")) } }
    };
    Ok(ctx.page(l.t("Audit verification", "审计日志校验"), body))
}
