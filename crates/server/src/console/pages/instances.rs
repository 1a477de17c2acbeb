//! `/instances`: the viewer's reservations (an admin's: everyone's), newest first, a page at a
//! time, their status refreshed live.

use axum::extract::{Query, State};
use axum::response::Response;
use gpurent_types::api::Reservation;
use maud::{html, Markup};
use serde::Deserialize;

use crate::console::api::enc;
use crate::console::lang::Lang;
use crate::console::layout::{maybe_time, money, raw, status, time, Ctx, PageError};
use crate::state::AppState;

/// Rows per page.
const PAGE: u32 = 50;

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    after: Option<String>,
}

pub(crate) async fn list(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<ListQuery>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?;
    let mut path = format!("/api/v1/reservations?limit={PAGE}");
    if let Some(after) = &q.after {
        path.push_str(&format!("&after={}", enc(after)));
    }
    let (list, next): (Vec<Reservation>, _) = api.page(&path).await.map_err(|f| ctx.failed(f))?;
    // The job arrays head the first page, each as one row; their tasks are not in the list.
    let arrays: Vec<Reservation> = if q.after.is_none() {
        api.get("/api/v1/arrays").await.map_err(|f| ctx.failed(f))?
    } else {
        Vec::new()
    };
    let body = html! {
        p { a.button href="/offers" { (l.t("Reserve GPUs", "预订 GPU")) } }
        @if !arrays.is_empty() {
            h2 { (l.t("Job arrays", "作业数组")) }
            div.scroll { table.arrays {
                thead { tr {
                    th scope="col" { (l.t("Array", "数组")) }
                    th scope="col" { (l.t("Status", "状态")) }
                    th scope="col" { (l.t("Tasks", "任务")) }
                    th scope="col" { (l.t("GPUs each", "每个任务的 GPU")) }
                    th scope="col" { (l.t("Charged", "已扣费")) }
                    th scope="col" { (l.t("Created", "创建时间")) }
                } }
                tbody { @for r in &arrays { @if let Some(a) = &r.array {
                    tr data-array-id=(r.id) {
                        th scope="row" { a href={ "/instances/" (r.id) } { (raw(&r.id)) } }
                        td { (status(r.status.as_str())) }
                        td { (raw(&a.spec)) ": " (a.done) " " (l.t("done", "完成")) ", "
                            (a.running) " " (l.t("running", "运行中")) ", " (a.failed) " "
                            (l.t("failed", "失败")) ", " (a.queued) " " (l.t("queued", "排队")) }
                        td { (gpus(l, r)) }
                        td { (money(r.charged)) }
                        td { (time(r.created_at)) }
                    }
                } } }
            } }
            h2 { (l.t("Instances", "实例")) }
        }
        div id="instances" data-live="1000" {
            @if list.is_empty() {
                p.empty { (l.t("No instances yet.", "还没有实例。")) }
            } @else {
                div.scroll {
                    table.instances {
                        thead { tr {
                            th scope="col" { (l.t("Instance", "实例")) }
                            th scope="col" { (l.t("Status", "状态")) }
                            th scope="col" { (l.t("GPUs", "GPU")) }
                            th scope="col" { (l.t("Node", "节点")) }
                            th scope="col" { (l.t("Price per hour", "每小时价格")) }
                            th scope="col" { (l.t("Charged", "已扣费")) }
                            th scope="col" { (l.t("Created", "创建时间")) }
                            th scope="col" { (l.t("Connect", "连接方式")) }
                        } }
                        tbody {
                            @for r in &list { (row(l, r)) }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a href={ "/instances?after=" (enc(&next)) } { (l.t("Older", "更早")) " →" } }
        }
    };
    Ok(ctx.page(l.t("Instances", "实例"), body))
}

/// How much of which GPU: `2 × RTX 4090`, or a share `12 GB of RTX 4090`.
pub(crate) fn gpus(l: Lang, r: &Reservation) -> Markup {
    html! {
        @match r.vram_gb {
            Some(gb) => { (gb) " GB " (l.t("of", "，")) " " (r.gpu_type) }
            None => { (r.gpu_count) " × " (r.gpu_type) }
        }
    }
}

/// How to get into it, while it runs.
pub(crate) fn connect(l: Lang, r: &Reservation) -> Markup {
    html! {
        @if r.status.as_str() == "running" {
            @if let Some(ssh) = &r.ssh {
                (raw(&ssh.command))
            } @else {
                (raw(&format!("gpurent ssh {}", r.id)))
            }
        } @else {
            span.muted { (l.t("when running", "运行后可连接")) }
        }
    }
}

fn row(l: Lang, r: &Reservation) -> Markup {
    html! {
        tr data-reservation-id=(r.id) {
            th scope="row" { a href={ "/instances/" (r.id) } { (raw(&r.id)) } }
            td { (status(r.status.as_str()))
                @if let Some(why) = &r.queue_reason { br; small.muted { (raw(why)) } }
            }
            td { (gpus(l, r)) }
            td { @if let Some(n) = &r.node { (raw(n)) } @else { "—" } }
            td { (money(r.price_per_hour)) }
            td { (money(r.charged)) }
            td { (time(r.created_at)) }
            td { (connect(l, r)) }
        }
    }
}

/// When it ended, if it did.
pub(crate) fn ended(r: &Reservation) -> Markup {
    maybe_time(r.ended_at)
}
