//! `/instances/ID`: one reservation: its status and facts (live), its log as it is written,
//! the web terminal, its published ports, and stopping it.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Redirect, Response};
use gpurent_types::api::{GpuUsage, Reservation, ReservationStopped};
use gpurent_types::RestartPolicy;
use maud::{html, Markup};
use serde::Deserialize;

use super::instances::{connect, ended, gpus};
use crate::console::api::enc;
use crate::console::assets;
use crate::console::charts;
use crate::console::lang::Lang;
use crate::console::layout::{
    maybe_time, money, raw, shell_line, status, time, Ctx, PageError, StyleNonce,
};
use crate::state::AppState;

/// Statuses a reservation can still be stopped in.
fn is_live(r: &Reservation) -> bool {
    matches!(r.status.as_str(), "pending" | "starting" | "running")
}

pub(crate) async fn page(
    State(state): State<AppState>,
    ctx: Ctx,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    // At the page's host: the API lists a running instance's published ports only with one.
    let api = ctx.api(&state)?.at_host_of(&headers);
    let r: Reservation = api
        .get(&format!("/api/v1/reservations/{}", enc(&id)))
        .await
        .map_err(|f| ctx.failed(f))?;
    let running = r.status.as_str() == "running";
    let nonce = StyleNonce::new();
    let body = html! {
        div id="summary" data-live="1000" {
            (summary(&ctx, &r))
        }
        (gpu_section(ctx.lang, &r))
        section aria-labelledby="log-h" {
            h2 id="log-h" { (l.t("Log", "日志")) }
            pre.log data-field="log" data-log-src={ "/instances/" (enc(&r.id)) "/log" } data-offset="0"
                data-follow=(if is_live(&r) { "true" } else { "false" })
                tabindex="0" aria-label=(l.t("The instance's output", "实例的输出")) {}
        }
        section aria-labelledby="term-h" {
            h2 id="term-h" { (l.t("Terminal", "终端")) }
            // xterm.js only where the terminal is (deferred: run in order once parsed).
            // terminal.js first: it gives the style nonce to the `<style>` elements xterm.js
            // makes, and starts the terminal once all three have run.
            link rel="stylesheet" href=(assets::url("xterm.css"));
            script src=(assets::url("terminal.js")) nonce=(nonce.as_str()) defer {}
            script src=(assets::url("xterm.js")) defer {}
            script src=(assets::url("addon-fit.js")) defer {}
            div.terminal data-field="terminal" data-socket={ "/instances/" (enc(&r.id)) "/terminal" }
                data-running=(if running { "true" } else { "false" })
                data-ended-text=(l.t("The session ended.", "会话已结束。"))
                data-exited-text=(l.t("The shell exited with status {}.", "终端会话已退出，退出码 {}。"))
                data-signal-text=(l.t("The shell was ended by signal {}.", "终端会话被信号 {} 终止。"))
                data-lost-text=(l.t("The connection was lost.", "连接已断开。"))
                data-refused-text=(l.t("The terminal could not connect: the instance runs no more, or is not yours.", "终端无法连接：实例已不在运行，或不属于你。"))
                data-not-running-text=(l.t("The instance is not running.", "实例未在运行。"))
                data-not-found-text=(l.t("No such instance.", "没有这个实例。"))
                data-session-ended-text=(l.t("Your session has ended; log in again.", "会话已结束，请重新登录。"))
                data-cannot-enter-text=(l.t("The terminal cannot enter the instance.", "终端无法进入实例。"))
                data-instance-lost-text=(l.t("The connection to the instance was lost.", "与实例的连接已断开。"))
                data-reconnect-text=(l.t("Reconnect", "重新连接"))
                data-waiting-text=(l.t("The terminal opens once the instance is running.", "实例运行后即可打开终端。")) {
                @if !running {
                    p.muted { (l.t("The terminal opens once the instance is running.", "实例运行后即可打开终端。")) }
                }
            }
        }
    };
    let title = format!("{} {}", l.t("Instance", "实例"), r.id);
    Ok(ctx.page_with_style_nonce(&title, body, &nonce))
}

fn summary(ctx: &Ctx, r: &Reservation) -> Markup {
    let l = ctx.lang;
    html! {
        p.status-line { (l.t("Status", "状态")) ": " (status(r.status.as_str()))
            @if let Some(why) = &r.end_reason { " · " (raw(why)) }
            @if let Some(why) = &r.queue_reason { " · " (raw(why)) }
        }
        dl.facts {
            dt { (l.t("GPUs", "GPU")) } dd { (gpus(l, r)) }
            dt { (l.t("Tier", "计费档位")) } dd { (raw(r.tier.as_str())) }
            dt { (l.t("Node", "节点")) } dd { @if let Some(n) = &r.node { (raw(n)) } @else { "—" } }
            dt { (l.t("Price per hour", "每小时价格")) } dd { (money(r.price_per_hour)) }
            dt { (l.t("Charged so far", "已扣费")) } dd data-field="charged" { (money(r.charged)) }
            dt { (l.t("Held", "预扣")) } dd { (money(r.held)) }
            dt { (l.t("Hours", "小时数")) } dd { (r.hours) }
            dt { (l.t("Created", "创建时间")) } dd { (time(r.created_at)) }
            dt { (l.t("Started", "开始时间")) } dd { (maybe_time(r.started_at)) }
            dt { (l.t("Ended", "结束时间")) } dd { (ended(r)) }
            @if let Some(why) = &r.end_message {
                dt { (l.t("Reason", "原因")) } dd data-field="end-message" { (raw(why)) }
            }
            @if let Some(a) = &r.array {
                dt { (l.t("Job array", "作业数组")) }
                dd data-field="array" {
                    (raw(&a.spec)) " · " (a.tasks) " " (l.t("tasks", "个任务")) ": "
                    (a.done) " " (l.t("done", "完成")) ", " (a.running) " " (l.t("running", "运行中")) ", "
                    (a.failed) " " (l.t("failed", "失败")) ", " (a.stopped) " " (l.t("stopped", "已停止")) ", "
                    (a.queued) " " (l.t("queued", "排队"))
                    @if let Some(m) = &a.message { br; small.muted { (raw(m)) } }
                }
            }
            @if let (Some(array), Some(index)) = (&r.array_id, r.array_index) {
                dt { (l.t("Task of", "所属数组")) }
                dd { a href={ "/instances/" (array) } { (raw(array)) } " [" (index) "]" }
            }
            @if r.restart != RestartPolicy::Never || !r.restarts.is_empty() {
                dt { (l.t("Restarts", "重启")) }
                dd data-field="restarts" {
                    (raw(r.restart.as_str())) " · " (r.restarts.len())
                    @if let Some(at) = r.retry_at {
                        " · " (l.t("next run not before", "下次运行不早于")) " " (time(at))
                    }
                    @if !r.restarts.is_empty() {
                        ul.plain { @for x in &r.restarts {
                            li { (l.t("run", "运行")) " " (x.epoch) ": " (raw(&x.cause)) " · " (time(x.at))
                                @if let Some(n) = &x.node { " · " (raw(n)) }
                                @if let Some(m) = &x.message { " · " (raw(m)) } }
                        } }
                    }
                }
            }
            dt { (l.t("Image", "镜像")) } dd { @if let Some(i) = &r.image { (raw(i)) } @else { "—" } }
            dt { (l.t("Command", "命令")) } dd { @if r.command.is_empty() { @if r.image.is_some() { (l.t("the image's own (interactive)", "镜像自带命令（交互式）")) } @else { (l.t("none: interactive, up for its hours", "无：交互式，在预订时长内保持运行")) } } @else { (raw(&shell_line(&r.command))) } }
            @if !r.volumes.is_empty() {
                dt { (l.t("Volumes", "存储卷")) }
                dd { @for (i, v) in r.volumes.iter().enumerate() { @if i > 0 { ", " } (v.name) " → " (v.path) @if v.read_only { " (" (l.t("read-only", "只读")) ")" } } }
            }
            dt { (l.t("Connect", "连接方式")) } dd { (connect(l, r)) }
            @if !r.http.is_empty() {
                dt { (l.t("Published ports", "已发布端口")) }
                dd { ul.plain { @for e in &r.http {
                    li { a href={ "/instances/" (enc(&r.id)) "/ports/" (e.port) } target="_blank" rel="noopener" { (l.t("port", "端口")) " " (e.port) } }
                } } }
            }
        }
        @if is_live(r) {
            form method="post" action={ "/instances/" (enc(&r.id)) "/stop" }
                data-confirm=(l.t("Stop this instance? Billing ends now and its processes are ended.", "确定停止此实例？计费立即结束，其进程将被终止。")) {
                (ctx.csrf_field())
                button.danger type="submit" data-action="stop" { (l.t("Stop", "停止")) }
            }
        }
    }
}

/// Its GPUs' utilisation and memory over its life, as an image (`gpu_chart`).
fn gpu_section(l: Lang, r: &Reservation) -> Markup {
    html! {
        section aria-labelledby="gpu-h" {
            h2 id="gpu-h" { (l.t("GPU use", "GPU 使用情况")) }
            @if r.started_at.is_some() {
                figure.chart {
                    img src={ "/instances/" (enc(&r.id)) "/gpu.svg" } data-chart="gpu"
                        alt=(l.t("The mean utilisation and memory used of its GPUs, hour by hour over its life.", "其 GPU 在运行期间每小时的平均利用率与显存使用量。"))
                        loading="lazy";
                    figcaption.hint {
                        (l.t("Hourly means from its node's telemetry (written once a minute); whole UTC hours, so the first and last may include time before its start or after its end.", "取自节点遥测的每小时平均值（每分钟写入一次）；按整点 UTC 小时统计，首尾两小时可能包含其开始前或结束后的时间。"))
                        @if r.vram_gb.is_some() {
                            " " (l.t("A share: the figures are the whole GPU's, its other instances' too.", "此为 GPU 份额：数据为整块 GPU 的，包括其他实例的使用。"))
                        }
                    }
                }
            } @else {
                p.muted { (l.t("Charted once it runs.", "运行后显示图表。")) }
            }
        }
    }
}

/// Its GPUs' utilisation and memory used over its life, as an SVG image.
pub(crate) async fn gpu_chart(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let usage: GpuUsage = api
        .get(&format!("/api/v1/reservations/{}/gpu-usage", enc(&id)))
        .await
        .map_err(|f| ctx.failed(f))?;
    let svg = charts::gpu_svg(ctx.lang, &usage).map_err(|e| PageError::internal(&e.to_string()))?;
    Ok(charts::svg_response(svg))
}

pub(crate) async fn stop(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let path = format!("/api/v1/reservations/{}/stop", enc(&id));
    let _: ReservationStopped = api
        .call(Method::POST, &path, &serde_json::json!({}))
        .await
        .map_err(|f| ctx.failed(f))?;
    Ok(Redirect::to(&format!("/instances/{}", enc(&id))).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct LogQuery {
    #[serde(default)]
    offset: u64,
}

/// The log from `offset` on, as the API gives it (`console.js` follows it).
pub(crate) async fn log(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(id): Path<String>,
    Query(q): Query<LogQuery>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let path = format!("/api/v1/reservations/{}/logs?offset={}", enc(&id), q.offset);
    let (headers, bytes) = api
        .send(Method::GET, &path, None)
        .await
        .map_err(|f| ctx.failed(f))?;
    let next = headers
        .get("x-log-next-offset")
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("0"));
    let mut response = bytes.into_response();
    let h = response.headers_mut();
    // Shown with `textContent`: the instance's bytes are never taken for markup.
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-log-next-offset", next);
    Ok(response)
}
