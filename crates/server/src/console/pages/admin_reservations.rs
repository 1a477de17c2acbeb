//! `/admin/reservations`: everyone's reservations, newest first, a page at a time, filtered by
//! status, tenant, node and GPU type. The API's list takes no filters, so each page the API
//! gives is filtered here (the page says so).

use axum::extract::{Query, State};
use axum::response::Response;
use gpurent_types::api::Reservation;
use maud::{html, Markup};
use serde::Deserialize;

use super::admin::subnav;
use super::instances::gpus;
use crate::console::api::enc;
use crate::console::lang::Lang;
use crate::console::layout::{money, raw, status, time, Ctx, PageError};
use crate::state::AppState;

/// Reservations read from the API per page, before the filters (`?limit=` up to the API's
/// most).
const PAGE: u32 = 200;

const STATUSES: [&str; 9] = [
    "pending",
    "starting",
    "running",
    "stopping",
    "stopped",
    "failed",
    "preempted",
    "lost",
    "expired",
];

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct Filters {
    status: String,
    tenant: String,
    node: String,
    gpu_type: String,
    after: String,
    limit: Option<u32>,
}

impl Filters {
    fn keeps(&self, r: &Reservation) -> bool {
        let has = |want: &str, got: &str| want.is_empty() || got.eq_ignore_ascii_case(want.trim());
        has(&self.status, r.status.as_str())
            && has(&self.tenant, &r.tenant_id)
            && has(&self.node, r.node.as_deref().unwrap_or(""))
            && (self.gpu_type.trim().is_empty()
                || normalise(&r.gpu_type) == normalise(&self.gpu_type))
    }

    fn any(&self) -> bool {
        [&self.status, &self.tenant, &self.node, &self.gpu_type]
            .iter()
            .any(|f| !f.trim().is_empty())
    }

    fn limit(&self) -> u32 {
        self.limit
            .unwrap_or(PAGE)
            .clamp(1, crate::pagination::MAX_LIMIT)
    }

    /// The query of the next page: the same filters from `after`.
    fn next(&self, after: &str) -> String {
        let mut path = format!(
            "/admin/reservations?status={}&tenant={}&node={}&gpu_type={}&after={}",
            enc(self.status.trim()),
            enc(self.tenant.trim()),
            enc(self.node.trim()),
            enc(self.gpu_type.trim()),
            enc(after)
        );
        if let Some(limit) = self.limit {
            path.push_str(&format!("&limit={limit}"));
        }
        path
    }
}

/// `RTX 4090`, `rtx4090` and `RTX-4090` are one type.
fn normalise(gpu_type: &str) -> String {
    gpu_type
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

pub(crate) async fn list(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(f): Query<Filters>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?;
    let mut path = format!("/api/v1/reservations?limit={}", f.limit());
    if !f.after.is_empty() {
        path.push_str(&format!("&after={}", enc(&f.after)));
    }
    let (page, next): (Vec<Reservation>, _) = api.page(&path).await.map_err(|e| ctx.failed(e))?;
    let read = page.len();
    let shown: Vec<&Reservation> = page.iter().filter(|r| f.keeps(r)).collect();
    let body = html! {
        (subnav(l, "/admin/reservations"))
        (filter_form(l, &f))
        p.hint data-field="filtered" {
            (l.t("The API lists reservations without filters: the filters apply to each page of", "API 的预订列表不支持筛选：筛选作用于每页"))
            " " (f.limit()) " "
            (l.t("reservations it gives, newest first. Shown:", "个预订（从新到旧）。本页显示："))
            " " (shown.len()) " / " (read)
        }
        @if shown.is_empty() {
            p.empty { (l.t("No reservations on this page match.", "本页没有符合条件的预订。")) }
        } @else {
            div.scroll { table data-table="reservations" {
                thead { tr {
                    th scope="col" { (l.t("Reservation", "预订")) }
                    th scope="col" { (l.t("Status", "状态")) }
                    th scope="col" { (l.t("Tenant", "租户")) }
                    th scope="col" { (l.t("GPUs", "GPU")) }
                    th scope="col" { (l.t("Node", "节点")) }
                    th scope="col" { (l.t("Tier", "计费档位")) }
                    th scope="col" { (l.t("Price per hour", "每小时价格")) }
                    th scope="col" { (l.t("Charged", "已扣费")) }
                    th scope="col" { (l.t("Created", "创建时间")) }
                } }
                tbody { @for r in &shown { (row(l, r)) } }
            } }
        }
        @if let Some(next) = next {
            p { a href=(f.next(&next)) data-action="next-page" { (l.t("Older", "更早")) " →" } }
        }
        @if !f.after.is_empty() || f.any() {
            p { a href="/admin/reservations" { (l.t("Back to the newest, without filters", "返回最新且不筛选")) } }
        }
    };
    Ok(ctx.page(l.t("Reservations", "预订"), body))
}

fn filter_form(l: Lang, f: &Filters) -> Markup {
    html! {
        form.card method="get" action="/admin/reservations" data-form="filters" {
            div.grid {
                div {
                    label for="f-status" { (l.t("Status", "状态")) }
                    select id="f-status" name="status" {
                        option value="" { (l.t("any", "全部")) }
                        @for s in STATUSES {
                            option value=(s) selected[f.status == s] { (s) }
                        }
                    }
                }
                div {
                    label for="f-tenant" { (l.t("Tenant (user id)", "租户（用户 ID）")) }
                    input id="f-tenant" name="tenant" type="text" value=(f.tenant);
                }
                div {
                    label for="f-node" { (l.t("Node (name)", "节点（名称）")) }
                    input id="f-node" name="node" type="text" value=(f.node);
                }
                div {
                    label for="f-gpu" { (l.t("GPU type", "GPU 型号")) }
                    input id="f-gpu" name="gpu_type" type="text" value=(f.gpu_type);
                }
            }
            button type="submit" { (l.t("Filter", "筛选")) }
        }
    }
}

fn row(l: Lang, r: &Reservation) -> Markup {
    html! {
        tr data-reservation-id=(r.id) {
            th scope="row" { a href={ "/instances/" (enc(&r.id)) } { (raw(&r.id)) } }
            td { (status(r.status.as_str())) }
            td { (raw(&r.tenant_id)) }
            td { (gpus(l, r)) }
            td { @if let Some(n) = &r.node { (raw(n)) } @else { "—" } }
            td { (raw(r.tier.as_str())) }
            td { (money(r.price_per_hour)) }
            td { (money(r.charged)) }
            td { (time(r.created_at)) }
        }
    }
}
