//! `/offers`: what can be rented now and at what price on each tier, and the reserve form,
//! which shows its price (`/offers/quote`, the billing crate's own quote) before it is sent.

use std::collections::BTreeMap;
use std::str::FromStr;

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use gpurent_billing::Size;
use gpurent_types::api::{
    command_words, CreateReservation, MountVolume, Offer, Reservation, Template,
};
use gpurent_types::{GpuType, Money, OnNodeLoss, RestartPolicy, Tier};
use maud::{html, Markup};
use serde::Deserialize;

use crate::console::api::Failure;
use crate::console::lang::Lang;
use crate::console::layout::{alert, money, raw, Ctx, PageError};
use crate::console::session::StrictForm;
use crate::state::AppState;

/// The reserve form as posted: every field text, as a browser sends it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct ReserveForm {
    gpu_type: String,
    gpu_count: String,
    vram_gb: String,
    vram_fraction: String,
    hours: String,
    tier: String,
    bid: String,
    template: String,
    image: String,
    command: String,
    env: String,
    secrets: String,
    ports: String,
    http_ports: String,
    volumes: String,
    queue: Option<String>,
    checkpoint: Option<String>,
    keep_idle: Option<String>,
    on_node_loss: String,
    restart: String,
    max_restarts: String,
    checkpoint_volume: String,
    idempotency_key: String,
}

/// Why a form's field is not what the API takes.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {why}")]
pub(crate) struct FieldError {
    field: &'static str,
    why: String,
}

fn field(field: &'static str, why: impl Into<String>) -> FieldError {
    FieldError {
        field,
        why: why.into(),
    }
}

fn opt<T: FromStr>(name: &'static str, text: &str) -> Result<Option<T>, FieldError>
where
    T::Err: std::fmt::Display,
{
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|e| field(name, format!("{e}")))
}

/// `KEY=VALUE` lines.
fn pairs(name: &'static str, text: &str) -> Result<BTreeMap<String, String>, FieldError> {
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| field(name, format!("{line:?} is not KEY=VALUE")))?;
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(out)
}

fn ports(name: &'static str, text: &str) -> Result<Vec<u16>, FieldError> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| field(name, format!("{p:?} is not a port (1-65535)")))
        })
        .collect()
}

impl ReserveForm {
    pub(crate) fn to_api(&self) -> Result<CreateReservation, FieldError> {
        let hours = opt::<f64>("hours", &self.hours)?.unwrap_or(1.0);
        let on_node_loss = match self.on_node_loss.trim() {
            "" => None,
            w => Some(OnNodeLoss::from_str(w).map_err(|e| field("on_node_loss", e.to_string()))?),
        };
        Ok(CreateReservation {
            gpu_type: self.gpu_type.trim().to_owned(),
            gpu_count: opt("gpu_count", &self.gpu_count)?,
            vram_gb: opt("vram_gb", &self.vram_gb)?,
            vram_fraction: opt("vram_fraction", &self.vram_fraction)?,
            hours,
            tier: opt::<Tier>("tier", &self.tier)?,
            bid: opt::<Money>("bid", &self.bid)?,
            image: Some(self.image.trim().to_owned()).filter(|i| !i.is_empty()),
            command: command_words(&self.command),
            env: pairs("env", &self.env)?,
            ports: ports("ports", &self.ports)?,
            http_ports: ports("http_ports", &self.http_ports)?,
            queue: self.queue.is_some(),
            on_node_loss,
            idle_reclaim: self.keep_idle.is_some().then_some(false),
            checkpoint: self.checkpoint.is_some(),
            secrets: pairs("secrets", &self.secrets)?,
            volumes: self
                .volumes
                .split([',', '\n'])
                .filter(|v| !v.trim().is_empty())
                .map(|v| MountVolume::parse(v).map_err(|e| field("volumes", e)))
                .collect::<Result<_, _>>()?,
            template: Some(self.template.trim().to_owned()).filter(|t| !t.is_empty()),
            team: None,
            restart: match self.restart.trim() {
                "" => None,
                w => Some(RestartPolicy::from_str(w).map_err(|e| field("restart", e.to_string()))?),
            },
            max_restarts: opt("max_restarts", &self.max_restarts)?,
            checkpoint_volume: Some(self.checkpoint_volume.trim().to_owned())
                .filter(|v| !v.is_empty()),
            array: None,
        })
    }
}

/// `/offers?template=NAME`: the form starting from that template.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StartFrom {
    template: String,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(start): Query<StartFrom>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let offers: Vec<Offer> = api.get("/api/v1/offers").await.map_err(|f| ctx.failed(f))?;
    let form = ReserveForm {
        template: start.template,
        gpu_type: offers
            .iter()
            .find(|o| o.available > 0)
            .map(|o| o.gpu_type.clone())
            .unwrap_or_default(),
        hours: "1".into(),
        ..ReserveForm::default()
    };
    let quote = quote_text(&state, ctx.lang, &offers, &form);
    let templates: Vec<Template> = api
        .get("/api/v1/templates")
        .await
        .map_err(|f| ctx.failed(f))?;
    Ok(render(
        &ctx,
        StatusCode::OK,
        (&offers, &templates),
        &form,
        None,
        &quote,
    ))
}

/// Reserves and leads to the new instance's page; a refusal shows the form again with why.
pub(crate) async fn reserve(
    State(state): State<AppState>,
    ctx: Ctx,
    StrictForm(form): StrictForm<ReserveForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let body = form.to_api().map_err(|e| Failure {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "validation".into(),
        message: e.to_string(),
    });
    let key = Some(form.idempotency_key.as_str()).filter(|k| !k.is_empty());
    let failure = match body {
        Ok(body) => match api
            .call_keyed::<_, Reservation>(Method::POST, "/api/v1/reservations", &body, key)
            .await
        {
            Ok(r) => return Ok(Redirect::to(&format!("/instances/{}", r.id)).into_response()),
            Err(f) => f,
        },
        Err(f) => f,
    };
    if failure.status.is_server_error() {
        return Err(ctx.failed(failure));
    }
    let offers: Vec<Offer> = api.get("/api/v1/offers").await.map_err(|f| ctx.failed(f))?;
    let quote = quote_text(&state, ctx.lang, &offers, &form);
    let templates: Vec<Template> = api
        .get("/api/v1/templates")
        .await
        .map_err(|f| ctx.failed(f))?;
    Ok(render(
        &ctx,
        failure.status,
        (&offers, &templates),
        &form,
        Some(&failure),
        &quote,
    ))
}

/// The price of the form as it stands, as one line of text (`console.js` asks as it changes).
pub(crate) async fn quote(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(form): Query<ReserveForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let offers: Vec<Offer> = api.get("/api/v1/offers").await.map_err(|f| ctx.failed(f))?;
    let text = quote_text(&state, ctx.lang, &offers, &form);
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

fn quote_text(state: &AppState, l: Lang, offers: &[Offer], form: &ReserveForm) -> String {
    match quote_of(state, offers, form) {
        Ok((per_hour, total, hold, hours)) => format!(
            "{per_hour} {c} {ph} · {total} {c} {for_} {hours} {h} · {hold} {c} {held}",
            c = crate::console::layout::currency(),
            ph = l.t("per hour", "每小时"),
            for_ = l.t("for", "共"),
            h = l.t("h", "小时"),
            held = l.t("held at the start", "开始时预扣"),
        ),
        Err(why) => why,
    }
}

/// The billing crate's quote for the form: per hour, for all its hours, and held now.
fn quote_of(
    state: &AppState,
    offers: &[Offer],
    form: &ReserveForm,
) -> Result<(Money, Money, Money, f64), String> {
    let body = form.to_api().map_err(|e| e.to_string())?;
    let gpu_type = GpuType::parse(&body.gpu_type).map_err(|e| format!("gpu_type: {e}"))?;
    let offer = offers
        .iter()
        .find(|o| GpuType::parse(&o.gpu_type).is_ok_and(|t| t.key() == gpu_type.key()))
        .ok_or_else(|| format!("no {gpu_type} is in the fleet now"))?;
    let gpu_vram_mb = offer.vram_mb;
    let new = crate::validate::reservation("console", &body, None, Some(gpu_vram_mb))
        .map_err(|e| e.to_string())?;
    let size = match new.want {
        gpurent_store::Want::Whole { count } => Size::Whole { count, gpu_vram_mb },
        gpurent_store::Want::Share { vram_mb } => Size::Share {
            vram_mb,
            gpu_vram_mb,
        },
    };
    let quote = state
        .live()
        .prices
        .quote(&new.gpu_type, size, new.duration_s, new.tier, new.bid)
        .map_err(|e| e.to_string())?;
    let total = quote.rate.charge_for_seconds(new.duration_s);
    Ok((quote.price_per_hour, total, quote.hold, body.hours))
}

/// The description of a template shipped with gpurent, in the page's language.
fn shipped_description(l: Lang, t: &Template) -> Option<&'static str> {
    if t.owner.is_some() || !t.public {
        return None;
    }
    Some(match t.name.as_str() {
        "shell" => l.t(
            "an interactive instance with no image, up for its hours",
            "无镜像的交互式实例，在预订时长内保持运行",
        ),
        "jupyter" => l.t(
            "JupyterLab on port 8888, published for you only",
            "JupyterLab，端口 8888，仅对您发布",
        ),
        "pytorch" => l.t(
            "PyTorch with CUDA; its shell stays up",
            "带 CUDA 的 PyTorch；其 shell 保持运行",
        ),
        _ => return None,
    })
}

fn tier_name(l: Lang, tier: Tier) -> &'static str {
    match tier {
        Tier::OnDemand => l.t("on-demand", "按需"),
        Tier::Stepped => l.t("stepped", "阶梯"),
        Tier::Spot => l.t("spot", "竞价"),
        Tier::Reserved => l.t("reserved", "预留"),
    }
}

fn render(
    ctx: &Ctx,
    status: StatusCode,
    (offers, templates): (&[Offer], &[Template]),
    form: &ReserveForm,
    failure: Option<&Failure>,
    quote: &str,
) -> Response {
    let l = ctx.lang;
    let body = html! {
        section aria-labelledby="offers-h" {
            h2 id="offers-h" { (l.t("Free now", "当前空闲")) }
            (offers_table(l, offers))
        }
        section aria-labelledby="reserve-h" {
            h2 id="reserve-h" { (l.t("Reserve", "预订")) }
            @if let Some(f) = failure { (alert(l, f)) }
            (reserve_form(ctx, (offers, templates), form, quote))
        }
    };
    ctx.page_with_status(status, l.t("Offers", "算力市场"), body)
}

fn offers_table(l: Lang, offers: &[Offer]) -> Markup {
    html! {
        @if offers.is_empty() {
            p.empty { (l.t("No GPUs are in the fleet yet.", "集群中还没有 GPU。")) }
        } @else {
            div.scroll {
                table.offers {
                    thead { tr {
                        th scope="col" { (l.t("GPU", "GPU")) }
                        th scope="col" { (l.t("Memory", "显存")) }
                        th scope="col" { (l.t("Free", "空闲")) }
                        th scope="col" { (tier_name(l, Tier::OnDemand)) " / " (l.t("h", "小时")) }
                        th scope="col" { (tier_name(l, Tier::Stepped)) }
                        th scope="col" { (tier_name(l, Tier::Spot)) " ≥" }
                        th scope="col" { (l.t("Share, per GB·h", "共享，每 GB·小时")) }
                        th scope="col" { (tier_name(l, Tier::Reserved)) }
                    } }
                    tbody {
                        @for o in offers {
                            tr data-gpu-type=(o.gpu_type) {
                                th scope="row" { (o.gpu_type) }
                                td { (o.vram_gb) " GB" }
                                td data-field="available" { (o.available)
                                    @if o.unisolated > 0 {
                                        " " span.warn title=(l.t("on nodes that run instances unisolated", "位于不隔离实例的节点上")) { "(" (o.unisolated) " " (l.t("unisolated", "未隔离")) ")" }
                                    } @else if o.shared_network > 0 {
                                        " " span.warn title=(l.t("on nodes whose instances share the node's network", "位于实例共享节点网络的节点上")) { "(" (o.shared_network) " " (l.t("network: shared", "网络：共享")) ")" }
                                    }
                                }
                                td { (money(o.price_per_hour)) }
                                td { (money(o.stepped_price_per_hour)) " × " (o.stepped_first_hours) " " (l.t("h", "小时")) ", " (l.t("then", "之后")) " " (money(o.stepped_then_per_hour)) }
                                td { (money(o.spot_min_bid)) }
                                td { (money(o.share_price_per_gb_hour)) }
                                td {
                                    @for d in &o.reserved_discounts {
                                        span.pill { "≥" (d.min_hours) " " (l.t("h", "小时")) ": −" (d.percent) "%" } " "
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn reserve_form(
    ctx: &Ctx,
    (offers, templates): (&[Offer], &[Template]),
    form: &ReserveForm,
    quote: &str,
) -> Markup {
    let l = ctx.lang;
    let key = if form.idempotency_key.is_empty() {
        crate::auth::new_token("rsv")
    } else {
        form.idempotency_key.clone()
    };
    let tiers = [Tier::OnDemand, Tier::Stepped, Tier::Spot, Tier::Reserved];
    html! {
        form.card method="post" action="/offers" data-form="reserve" data-quote="/offers/quote" {
            (ctx.csrf_field())
            input type="hidden" name="idempotency_key" value=(key);
            div.grid {
                div {
                    label for="gpu_type" { (l.t("GPU type", "GPU 型号")) }
                    select id="gpu_type" name="gpu_type" required {
                        @for o in offers {
                            option value=(o.gpu_type) selected[o.gpu_type == form.gpu_type] { (o.gpu_type) " (" (o.available) " " (l.t("free", "空闲")) ")" }
                        }
                    }
                }
                div {
                    label for="gpu_count" { (l.t("Whole GPUs", "整卡数量")) }
                    input id="gpu_count" name="gpu_count" type="number" min="1" max="64" placeholder="1" value=(form.gpu_count);
                }
                div {
                    label for="vram_gb" { (l.t("or a share: GB of memory", "或共享：显存 GB")) }
                    input id="vram_gb" name="vram_gb" type="number" min="1" max="1024" value=(form.vram_gb);
                }
                div {
                    label for="vram_fraction" { (l.t("or a share: fraction of the GPU (0.5: half)", "或共享：显卡的比例（0.5 即一半）")) }
                    input id="vram_fraction" name="vram_fraction" type="number" min="0.01" max="1" step="0.01" value=(form.vram_fraction);
                }
                div {
                    label for="hours" { (l.t("Hours", "小时数")) }
                    input id="hours" name="hours" type="number" min="0.01" max="8760" step="0.01" required value=(form.hours);
                }
                div {
                    label for="tier" { (l.t("Tier", "计费档位")) }
                    select id="tier" name="tier" {
                        @for t in tiers {
                            option value=(t.as_str()) selected[form.tier == t.as_str()] { (tier_name(l, t)) }
                        }
                    }
                }
                div {
                    label for="bid" { (l.t("Spot bid per hour", "竞价出价（每小时）")) }
                    input id="bid" name="bid" type="text" inputmode="decimal" placeholder="0.80" value=(form.bid);
                }
                div.wide {
                    label for="template" { (l.t("Start from a template", "从模板开始")) }
                    select id="template" name="template" {
                        option value="" selected[form.template.is_empty()] { (l.t("none", "不使用")) }
                        @for t in templates {
                            // Names and their owners' descriptions are data, not the console's text.
                            option value=(t.name) selected[t.name == form.template] translate="no" {
                                (t.name)
                                @if let Some(d) = shipped_description(l, t).or(t.description.as_deref()) { " — " (d) }
                            }
                        }
                    }
                    p.hint { (l.t("Its image, command, environment and HTTP ports, where the fields below are left empty; a volume given as NAME alone goes to its volume mount. All of them:", "模板提供镜像、命令、环境变量和 HTTP 端口（下方字段留空时使用）；只写卷名的存储卷挂载到模板的挂载点。查看全部：")) " " code { "gpurent templates ls" } }
                }
                div.wide {
                    label for="image" { (l.t("Image (Docker executor)", "镜像（Docker 执行器）")) }
                    input id="image" name="image" type="text" placeholder="pytorch/pytorch:latest" value=(form.image);
                }
                div.wide {
                    label for="command" { (l.t("Command", "命令")) }
                    input id="command" name="command" type="text" placeholder="python train.py" value=(form.command);
                    p.hint { (l.t("Empty: an interactive instance that stays up for its hours (with an image: the image's own command); enter it from its page's terminal or with gpurent ssh. A command ends the instance when it ends; run it through sh -c when it uses the shell (pipes, ;, quotes, $).", "留空：交互式实例，在预订时长内保持运行（指定镜像时运行镜像自带的命令）；可通过实例页面的终端或 SSH 进入。填写命令时，命令结束即实例结束；含有管道、分号、引号或 $ 时通过 sh -c 运行。")) }
                }
                div {
                    label for="env" { (l.t("Environment", "环境变量")) " (" (raw("KEY=VALUE")) " " (l.t("per line", "每行一个")) ")" }
                    textarea id="env" name="env" rows="3" { (form.env) }
                }
                div {
                    label for="secrets" { (l.t("Secrets", "密钥")) " (" (raw("KEY=VALUE")) " " (l.t("per line, never shown again", "每行一个，之后不再显示")) ")" }
                    textarea id="secrets" name="secrets" rows="3" autocomplete="off" {}
                }
                div {
                    label for="volumes" { (l.t("Volumes", "存储卷")) " (" (raw("NAME:/PATH[:ro]")) ")" }
                    input id="volumes" name="volumes" type="text" placeholder="data:/workspace" value=(form.volumes);
                    p.hint { (l.t("Your volumes (gpurent volumes create), comma-separated: their data outlives the instance. A node-local volume runs the instance on its node.", "您已创建的存储卷，以逗号分隔：其数据在实例结束后仍保留。节点本地卷会让实例运行在该卷所在的节点上。")) }
                }
                div {
                    label for="http_ports" { (l.t("HTTP ports to publish", "发布的 HTTP 端口")) }
                    input id="http_ports" name="http_ports" type="text" placeholder="8888" value=(form.http_ports);
                }
                div {
                    label for="ports" { (l.t("Ports on the node (Docker)", "节点端口（Docker）")) }
                    input id="ports" name="ports" type="text" placeholder="8080" value=(form.ports);
                }
                div {
                    label for="on_node_loss" { (l.t("If its node is lost", "节点失联时")) }
                    select id="on_node_loss" name="on_node_loss" {
                        option value="reschedule" selected[form.on_node_loss != "stop"] { (l.t("run it again elsewhere", "在其他节点重新运行")) }
                        option value="stop" selected[form.on_node_loss == "stop"] { (l.t("end it", "结束")) }
                    }
                }
                div {
                    label for="restart" { (l.t("Run it again (a managed job)", "重新运行（托管任务）")) }
                    select id="restart" name="restart" {
                        @for (value, en, zh) in [
                            ("never", "never", "从不"),
                            ("on-interruption", "when interrupted (preempted, node lost or drained)", "被中断时（抢占、节点失联或排空）"),
                            ("on-failure", "when interrupted or failed", "被中断或失败时"),
                            ("always", "always, up to the bound", "总是（不超过上限）"),
                        ] {
                            option value=(value) selected[form.restart == value] { (l.t(en, zh)) }
                        }
                    }
                    p.hint { (l.t("A run that ends goes back to the queue under the same id; the wait is not billed. Failures are retried after 5 s, doubling, up to the bound.", "结束的运行以同一 ID 回到队列；等待不计费。失败会在 5 秒后重试，间隔加倍，直至上限。")) }
                }
                div {
                    label for="max_restarts" { (l.t("Most failed runs started again", "失败后最多重启次数")) }
                    input id="max_restarts" name="max_restarts" type="number" min="0" max="100" placeholder="3" value=(form.max_restarts);
                }
                div {
                    label for="checkpoint_volume" { (l.t("Checkpoint volume, at", "检查点存储卷，挂载于")) " " (raw("/checkpoint")) }
                    input id="checkpoint_volume" name="checkpoint_volume" type="text" placeholder="ckpt" value=(form.checkpoint_volume);
                }
                fieldset.checks {
                    legend { (l.t("Options", "选项")) }
                    label { input type="checkbox" name="queue" checked[form.queue.is_some()]; " " (l.t("Wait in the queue when nothing is free", "无空闲时排队等待")) }
                    label { input type="checkbox" name="checkpoint" checked[form.checkpoint.is_some()]; " " (l.t("Checkpoint volume", "检查点卷")) }
                    label { input type="checkbox" name="keep_idle" checked[form.keep_idle.is_some()]; " " (l.t("Keep running when idle", "空闲时保持运行")) }
                }
            }
            p.quote {
                (l.t("Price:", "价格：")) " "
                output data-field="quote" for="gpu_type gpu_count vram_gb vram_fraction hours tier bid" aria-live="polite" { (quote) }
            }
            button type="submit" { (l.t("Reserve", "预订")) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_uses_the_shell_only_when_it_needs_one() {
        assert_eq!(
            command_words("python train.py --lr 3"),
            ["python", "train.py", "--lr", "3"]
        );
        assert_eq!(
            command_words("echo a; sleep 1"),
            ["sh", "-c", "echo a; sleep 1"]
        );
        assert_eq!(command_words("  "), Vec::<String>::new());
    }

    #[test]
    fn the_form_becomes_the_api_body() {
        let form = ReserveForm {
            gpu_type: "RTX 4090".into(),
            vram_gb: "12".into(),
            hours: "2.5".into(),
            tier: "spot".into(),
            bid: "0.90".into(),
            env: "A=1\nB = two\n".into(),
            http_ports: "8888, 6006".into(),
            volumes: "data:/workspace, sets:/data:ro".into(),
            queue: Some("on".into()),
            ..ReserveForm::default()
        };
        let body = form.to_api().unwrap();
        assert_eq!(body.vram_gb, Some(12));
        assert_eq!(body.gpu_count, None);
        assert_eq!(body.tier, Some(Tier::Spot));
        assert_eq!(body.bid, Some(Money::from_str("0.90").unwrap()));
        assert_eq!(body.env.get("B").map(String::as_str), Some("two"));
        assert_eq!(body.http_ports, [8888, 6006]);
        assert_eq!(body.volumes.len(), 2);
        assert!(body.volumes[1].read_only);
        assert!(body.queue);
        let half = ReserveForm {
            vram_gb: String::new(),
            vram_fraction: "0.5".into(),
            ..form.clone()
        };
        assert_eq!(half.to_api().unwrap().vram_fraction, Some(0.5));
        let bad = ReserveForm {
            ports: "80,x".into(),
            ..form
        };
        assert_eq!(
            bad.to_api().unwrap_err().to_string(),
            "ports: \"x\" is not a port (1-65535)"
        );
    }
}
