//! `/endpoints`: the viewer's endpoints (an admin's: everyone's), their status refreshed live;
//! `/endpoints/NAME`: one endpoint's settings, URLs, figures and replicas, and its ready
//! replicas over the last hour as an SVG image (`/endpoints/NAME/replicas.svg`).

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use gpurent_types::api::{Endpoint, EndpointState};
use maud::{html, Markup};

use crate::console::api::enc;
use crate::console::charts;
use crate::console::lang::Lang;
use crate::console::layout::{maybe_time, raw, shell_line, status, time, Ctx, PageError};
use crate::state::AppState;

/// How a new endpoint is made (the CLI; the console has no form for it yet).
const CREATE: &str = "gpurent endpoints create NAME --gpu TYPE --image IMG --port 8000";

/// An endpoint's state in the viewer's language, as the contract's `data-field="status"`.
fn state_word(l: Lang, s: EndpointState) -> Markup {
    let word = match s {
        EndpointState::Idle => l.t("idle", "空闲"),
        EndpointState::Starting => l.t("starting", "启动中"),
        EndpointState::Ready => l.t("ready", "就绪"),
        EndpointState::Failing => l.t("failing", "故障"),
        EndpointState::OutOfCredit => l.t("out of credit", "余额不足"),
    };
    html! { span.status data-field="status" data-status=(s.as_str()) { (word) } }
}

/// Each replica's shape: `1 × rtx4090`, or a share `12 GB of rtx4090`.
fn shape(l: Lang, e: &Endpoint) -> Markup {
    html! {
        @match e.vram_gb {
            Some(gb) => { (gb) " GB " (l.t("of", "，")) " " (raw(&e.gpu_type)) }
            None => { (e.gpu_count) " × " (raw(&e.gpu_type)) }
        }
    }
}

/// Milliseconds, or a dash before any were measured.
fn ms(v: Option<f64>) -> Markup {
    match v {
        Some(v) => html! { (format!("{v:.1}")) " ms" },
        None => html! { "—" },
    }
}

fn yes_no(l: Lang, b: bool) -> &'static str {
    if b {
        l.t("yes", "是")
    } else {
        l.t("no", "否")
    }
}

pub(crate) async fn list(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?.at_host_of(&headers);
    let list: Vec<Endpoint> = api
        .get("/api/v1/endpoints")
        .await
        .map_err(|f| ctx.failed(f))?;
    let body = html! {
        div id="endpoints" data-live="2000" {
            @if list.is_empty() {
                p.empty data-field="no-endpoints" {
                    (l.t("No endpoints yet. An endpoint serves an app behind one URL, with replicas that start and stop with its traffic. Make one with:", "还没有端点。端点在一个固定 URL 后提供应用服务，其副本随流量启停。创建方式："))
                }
                pre { code translate="no" { (CREATE) } }
            } @else {
                div.scroll {
                    table.endpoints {
                        thead { tr {
                            th scope="col" { (l.t("Endpoint", "端点")) }
                            th scope="col" { (l.t("Status", "状态")) }
                            th scope="col" { (l.t("Ready / replicas", "就绪 / 副本")) }
                            th scope="col" { (l.t("Requests per second", "每秒请求数")) }
                            th scope="col" { (l.t("Latency p99", "延迟 p99")) }
                            th scope="col" { "URL" }
                        } }
                        tbody {
                            @for e in &list { (row(l, e)) }
                        }
                    }
                }
            }
        }
    };
    Ok(ctx.page(l.t("Endpoints", "端点"), body))
}

fn row(l: Lang, e: &Endpoint) -> Markup {
    html! {
        tr data-endpoint=(e.name) {
            th scope="row" { a href={ "/endpoints/" (enc(&e.name)) } { (raw(&e.name)) } }
            td { (state_word(l, e.status))
                @if let Some(why) = &e.message { br; small.muted { (raw(why)) } }
            }
            td data-field="replicas" { (e.ready_replicas) " / " (e.replicas.len()) }
            td { (format!("{:.2}", e.figures.requests_per_s)) }
            td { (ms(e.figures.p99_ms)) }
            td { (raw(&e.url)) }
        }
    }
}

pub(crate) async fn page(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(&state)?.at_host_of(&headers);
    let e: Endpoint = api
        .get(&format!("/api/v1/endpoints/{}", enc(&name)))
        .await
        .map_err(|f| ctx.failed(f))?;
    let s = &e.scaling;
    let body = html! {
        div id="endpoint-status" data-live="2000" {
            p.status-line { (l.t("Status", "状态")) ": " (state_word(l, e.status))
                @if let Some(why) = &e.message { " · " (raw(why)) }
            }
        }
        section aria-labelledby="settings-h" {
            h2 id="settings-h" { (l.t("Settings", "设置")) }
            dl.facts data-field="settings" {
                dt { (l.t("Each replica", "每个副本")) } dd data-field="shape" { (shape(l, &e)) }
                dt { (l.t("Tier", "计费档位")) } dd { (raw(e.tier.as_str())) }
                dt { (l.t("Image", "镜像")) } dd data-field="image" { @if let Some(i) = &e.image { (raw(i)) } @else { "—" } }
                dt { (l.t("Command", "命令")) } dd data-field="command" { @if e.command.is_empty() { "—" } @else { (raw(&shell_line(&e.command))) } }
                @if !e.env.is_empty() {
                    dt { (l.t("Environment", "环境变量")) }
                    dd { @for (i, k) in e.env.iter().enumerate() { @if i > 0 { ", " } (raw(k)) } }
                }
                dt { (l.t("Port", "端口")) } dd data-field="port" { (e.port) }
                dt { (l.t("Replicas", "副本数")) } dd data-field="scaling" { (s.min_replicas) " – " (s.max_replicas) }
                dt { (l.t("Target requests in flight per replica", "每副本目标并发请求数")) } dd { (s.target_inflight) }
                dt { (l.t("Scale in after", "低于目标多久后缩容")) } dd { (s.scale_down_after_s) " " (l.t("s", "秒")) }
                dt { (l.t("Health check path", "健康检查路径")) } dd { (raw(&s.health_path)) }
                dt { (l.t("Public (no key needed)", "公开（无需密钥）")) } dd { (yes_no(l, s.public)) }
                dt { (l.t("Queue timeout", "排队超时")) } dd { (s.queue_timeout_s) " " (l.t("s", "秒")) }
                dt { (l.t("Most requests waiting", "最多排队请求数")) } dd { (s.max_queue) }
                dt { (l.t("Largest request body", "最大请求体")) } dd { (s.max_body_mb) " MiB" }
                dt { (l.t("Generation", "代次")) } dd { (e.generation) }
                dt { (l.t("Created", "创建时间")) } dd { (time(e.created_at)) }
            }
        }
        section aria-labelledby="urls-h" {
            h2 id="urls-h" { (l.t("URLs", "URL")) }
            dl.facts {
                dt { (l.t("For API clients (with a key)", "供 API 客户端使用（需密钥）")) } dd data-field="url" { (raw(&e.url)) }
                dt { (l.t("For a browser (the app's own site)", "供浏览器使用（应用自己的站点）")) } dd data-field="app-url" { (raw(&e.app_url)) }
            }
        }
        div id="endpoint-live" data-live="2000" {
            (replicas(l, &e))
            (figures(l, &e))
        }
        section aria-labelledby="chart-h" {
            h2 id="chart-h" { (l.t("Ready replicas over the last hour", "近一小时的就绪副本数")) }
            figure.chart {
                img src={ "/endpoints/" (enc(&e.name)) "/replicas.svg" } data-chart="replicas"
                    alt=(l.t("The endpoint's ready replicas over the last hour, a step at each change.", "近一小时内端点的就绪副本数，每次变化为一级台阶。"))
                    loading="lazy";
                figcaption.hint { (l.t("As this control plane counted them; times in UTC.", "按本控制平面的统计；时间为 UTC。")) }
            }
        }
    };
    let title = format!("{} {}", l.t("Endpoint", "端点"), e.name);
    Ok(ctx.page(&title, body))
}

fn figures(l: Lang, e: &Endpoint) -> Markup {
    let f = &e.figures;
    html! {
        section aria-labelledby="figures-h" {
            h2 id="figures-h" { (l.t("Figures", "指标")) }
            p.hint { (l.t("As this control plane counted them since it started.", "本控制平面自启动以来的统计。")) }
            dl.facts data-field="figures" {
                dt { (l.t("Requests", "请求数")) } dd data-field="requests" { (f.requests) }
                dt { (l.t("Requests per second (last minute)", "每秒请求数（近一分钟）")) } dd { (format!("{:.2}", f.requests_per_s)) }
                dt { (l.t("Latency p50 / p99", "延迟 p50 / p99")) } dd { (ms(f.p50_ms)) " / " (ms(f.p99_ms)) }
                dt { (l.t("Queue wait p50 / p99", "排队等待 p50 / p99")) } dd { (ms(f.queue_wait_p50_ms)) " / " (ms(f.queue_wait_p99_ms)) }
                dt { (l.t("Waiting now", "正在排队")) } dd data-field="queued" { (f.queued) }
                dt { (l.t("In flight now", "正在处理")) } dd data-field="inflight" { (f.inflight) }
                dt { (l.t("Refused by the control plane (429, 502, 503)", "被控制平面拒绝（429、502、503）")) } dd data-field="rejected" { (f.rejected) }
                dt { (l.t("Cold starts", "冷启动次数")) } dd data-field="cold-starts" { (f.cold_starts) }
                dt { (l.t("Cold start p50 / p99", "冷启动 p50 / p99")) } dd { (ms(f.cold_start_p50_ms)) " / " (ms(f.cold_start_p99_ms)) }
            }
        }
    }
}

fn replicas(l: Lang, e: &Endpoint) -> Markup {
    html! {
        section aria-labelledby="replicas-h" {
            h2 id="replicas-h" { (l.t("Replicas", "副本")) " (" (e.ready_replicas) " / " (e.replicas.len()) ")" }
            @if e.replicas.is_empty() {
                p.empty { (l.t("No replicas now: the next request starts one.", "当前没有副本：下一个请求会启动一个。")) }
            } @else {
                div.scroll { table data-table="replicas" {
                    thead { tr {
                        th scope="col" { (l.t("Replica", "副本")) }
                        th scope="col" { (l.t("Instance", "实例")) }
                        th scope="col" { (l.t("Status", "状态")) }
                        th scope="col" { (l.t("Ready", "就绪")) }
                        th scope="col" { (l.t("Node", "节点")) }
                        th scope="col" { (l.t("Generation", "代次")) }
                        th scope="col" { (l.t("In flight", "处理中")) }
                        th scope="col" { (l.t("Started", "开始时间")) }
                    } }
                    tbody { @for r in &e.replicas {
                        tr data-replica=(r.index) {
                            th scope="row" { (r.index) }
                            td { a href={ "/instances/" (enc(&r.id)) } { (raw(&r.id)) } }
                            td { (status(r.status.as_str())) }
                            td data-field="ready" { (yes_no(l, r.ready)) }
                            td { @if let Some(n) = &r.node { (raw(n)) } @else { "—" } }
                            td { (r.generation) }
                            td { (r.inflight) }
                            td { (maybe_time(r.started_at)) }
                        }
                    } }
                } }
            }
        }
    }
}

/// The ready replicas over the last hour, as an SVG image.
pub(crate) async fn replicas_chart(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let e: Endpoint = api
        .get(&format!("/api/v1/endpoints/{}", enc(&name)))
        .await
        .map_err(|f| ctx.failed(f))?;
    let svg = charts::replicas_svg(
        ctx.lang,
        &e.figures.replicas_over_time,
        state.now(),
        e.ready_replicas,
    )
    .map_err(|e| PageError::internal(&e.to_string()))?;
    Ok(charts::svg_response(svg))
}
