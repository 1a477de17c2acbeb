//! `/admin/events`: what happened to nodes (health breaches and recoveries), oldest first, a
//! page at a time from the last event id seen, as `GET /api/v1/events` gives them.

use axum::extract::{Query, State};
use axum::response::Response;
use gpurent_types::api::Event;
use maud::html;
use serde::Deserialize;

use super::admin::subnav;
use crate::console::layout::{raw, time, Ctx, PageError};
use crate::state::AppState;

/// Events per page.
const PAGE: usize = 100;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct EventsQuery {
    after: i64,
}

pub(crate) async fn list(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<EventsQuery>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?;
    let after = q.after.max(0);
    let events: Vec<Event> = api
        .get(&format!("/api/v1/events?after={after}&limit={PAGE}"))
        .await
        .map_err(|f| ctx.failed(f))?;
    let last = events.last().map(|e| e.id);
    let body = html! {
        (subnav(l, "/admin/events"))
        p.hint { (l.t("Oldest first; each page goes on from the last event of the one before.", "从旧到新；每页从上一页的最后一个事件之后继续。")) }
        @if events.is_empty() {
            p.empty { (l.t("No events after this point.", "此后没有事件。")) }
        } @else {
            div.scroll { table data-table="events" {
                thead { tr {
                    th scope="col" { "#" }
                    th scope="col" { (l.t("Time", "时间")) }
                    th scope="col" { (l.t("Node", "节点")) }
                    th scope="col" { (l.t("Kind", "类型")) }
                    th scope="col" { (l.t("Detail", "详情")) }
                } }
                tbody { @for e in &events {
                    tr data-event-id=(e.id) {
                        td { (e.id) }
                        td { (time(e.at)) }
                        td { @if let Some(n) = &e.node_id { (raw(n)) } @else { "—" } }
                        td { (raw(&e.kind)) }
                        td { (raw(&e.detail)) }
                    }
                } }
            } }
        }
        p.actions {
            @if after > 0 { a href="/admin/events" { (l.t("From the first", "从头开始")) } }
            @if let Some(last) = last.filter(|_| events.len() >= PAGE) {
                a href={ "/admin/events?after=" (last) } data-action="next-page" { (l.t("Newer", "更新")) " →" }
            }
        }
    };
    Ok(ctx.page(l.t("Events", "事件"), body))
}
