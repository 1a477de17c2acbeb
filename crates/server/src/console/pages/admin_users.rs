//! `/admin/users`: every user with their balance and caps; creating one (its API token shown
//! once, on the page that answers the form), granting credit, and setting a user's caps.

use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use gpurent_types::api::{CreateUser, CreditGranted, GrantCredit, UpdateUser, User, UserCreated};
use gpurent_types::{Money, Role};
use maud::{html, Markup};
use serde::Deserialize;

use super::admin::subnav;
use crate::console::api::{enc, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, money, raw, role_name, time, Ctx, PageError};
use crate::state::AppState;

/// Rows per page.
const PAGE: u32 = 50;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ListQuery {
    after: Option<String>,
    /// What the last form did, for the notice at the top: `credit` or `limits`.
    done: Option<String>,
    user: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct CreateForm {
    name: String,
    role: String,
    credit: String,
    idempotency_key: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct CreditForm {
    amount: String,
    idempotency_key: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct LimitsForm {
    max_reservations: String,
    max_spend_per_hour: String,
    role: String,
}

pub(crate) async fn list(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<ListQuery>,
) -> Result<Response, PageError> {
    render(&state, &ctx, &q, None, None).await
}

/// The list with what a form left to say above it: a created user's token, or a failure.
async fn render(
    state: &AppState,
    ctx: &Ctx,
    q: &ListQuery,
    created: Option<&UserCreated>,
    failure: Option<&Failure>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(state)?;
    let mut path = format!("/api/v1/users?limit={PAGE}");
    if let Some(after) = q.after.as_deref().filter(|a| !a.is_empty()) {
        path.push_str(&format!("&after={}", enc(after)));
    }
    let (users, next): (Vec<User>, _) = api.page(&path).await.map_err(|f| ctx.failed(f))?;
    let body = html! {
        (subnav(l, "/admin/users"))
        @if let Some(f) = failure { (alert(l, f)) }
        @if let Some(c) = created { (created_notice(l, c)) }
        @if let (Some(done), Some(user)) = (q.done.as_deref(), q.user.as_deref()) {
            div.alert.ok role="status" {
                @match done {
                    "credit" => { (l.t("Credit granted to", "已为该用户充值：")) " " (raw(user)) }
                    "password" => { (l.t("Password set for", "已设置该用户的密码：")) " " (raw(user)) }
                    _ => { (l.t("Caps set for", "已设置该用户的上限：")) " " (raw(user)) }
                }
            }
        }
        (create_form(ctx))
        h2 { (l.t("Users", "用户")) }
        @if users.is_empty() {
            p.empty { (l.t("No users.", "没有用户。")) }
        } @else {
            div.scroll { table.users data-table="users" {
                thead { tr {
                    th scope="col" { (l.t("Name", "用户名")) }
                    th scope="col" { (l.t("Role", "角色")) }
                    th scope="col" { (l.t("Balance", "余额")) }
                    th scope="col" { (l.t("Caps", "上限")) }
                    th scope="col" { (l.t("Created", "创建时间")) }
                    th scope="col" { (l.t("Grant credit", "充值")) }
                    th scope="col" { (l.t("Set caps", "设置上限")) }
                } }
                tbody { @for u in &users { (row(ctx, u)) } }
            } }
        }
        @if let Some(next) = next {
            p { a href={ "/admin/users?after=" (enc(&next)) } { (l.t("More", "更多")) " →" } }
        }
        p.hint { (l.t("Caps: an empty field leaves that cap as it is. The last admin cannot lose its role.", "上限：留空的字段保持不变。最后一位管理员不能失去管理员角色。")) }
    };
    let status = failure.map_or(StatusCode::OK, |f| f.status);
    Ok(ctx.page_with_status(status, l.t("Users", "用户"), body))
}

fn created_notice(l: Lang, c: &UserCreated) -> Markup {
    html! {
        div.alert.ok role="status" data-field="created-user" {
            p { strong { (l.t("User created:", "用户已创建：")) } " " (raw(&c.name)) " · " (role_name(l, c.role)) " · " (raw(&c.id)) }
            p { (l.t("Their API token, shown only this once: give it to them now.", "其 API 令牌仅显示这一次，请立即交给该用户。")) }
            p { code data-field="token" { (c.token) } }
            p.hint { (l.t("They can log in to this console once a password is set:", "设置密码后即可登录控制台：")) " " (raw(&format!("gpurent users passwd {}", c.id))) " " (l.t("or the form in its row below.", "或下方该用户行中的表单。")) }
        }
    }
}

fn create_form(ctx: &Ctx) -> Markup {
    let l = ctx.lang;
    let key = crate::auth::new_token("usr");
    html! {
        details.card {
            summary { (l.t("Create a user", "创建用户")) }
            form method="post" action="/admin/users" data-form="create-user" {
                (ctx.csrf_field())
                input type="hidden" name="idempotency_key" value=(key);
                div.grid {
                    div {
                        label for="new-name" { (l.t("Name", "用户名")) }
                        input id="new-name" name="name" type="text" required pattern="[A-Za-z0-9_.@\\-]{1,64}" autocomplete="off";
                    }
                    div {
                        label for="new-role" { (l.t("Role", "角色")) }
                        select id="new-role" name="role" {
                            @for role in [Role::Tenant, Role::Host, Role::Admin] {
                                option value=(role.as_str()) { (role_name(l, role)) }
                            }
                        }
                    }
                    div {
                        label for="new-credit" { (l.t("Credit", "初始额度")) " (" (crate::console::layout::currency()) ")" }
                        input id="new-credit" name="credit" type="text" inputmode="decimal" placeholder="0.00";
                    }
                }
                button type="submit" { (l.t("Create", "创建")) }
            }
        }
    }
}

/// A user's facts and its two forms (the table scrolls sideways on a phone).
fn row(ctx: &Ctx, u: &User) -> Markup {
    let l = ctx.lang;
    let id = enc(&u.id);
    html! {
        tr data-user-id=(u.id) {
            th scope="row" { (raw(&u.name)) br; small { (raw(&u.id)) } }
            td { (role_name(l, u.role)) }
            td data-field="balance" { (money(u.balance)) }
            td data-field="caps" {
                (l.t("reservations", "预订数")) ": " @match u.max_reservations { Some(n) => { (n) }, None => { (l.t("default", "默认")) } }
                br;
                (l.t("per hour", "每小时")) ": " @match u.max_spend_per_hour { Some(m) => { (money(m)) }, None => { (l.t("default", "默认")) } }
            }
            td { (time(u.created_at)) }
            td {
                form.row method="post" action={ "/admin/users/" (id) "/credit" } data-form="credit" {
                    (ctx.csrf_field())
                    input type="hidden" name="idempotency_key" value=(crate::auth::new_token("crd"));
                    label for={ "amount-" (u.id) } { (l.t("Amount", "金额")) " (" (crate::console::layout::currency()) ")" }
                    input id={ "amount-" (u.id) } name="amount" type="text" inputmode="decimal" required placeholder="10.00";
                    button.small type="submit" { (l.t("Grant", "充值")) }
                }
            }
            td {
                form.row method="post" action={ "/admin/users/" (id) "/limits" } data-form="limits" {
                    (ctx.csrf_field())
                    label for={ "maxr-" (u.id) } { (l.t("Most live reservations", "最多同时预订数")) }
                    input id={ "maxr-" (u.id) } name="max_reservations" type="number" min="0" max="1000000"
                        value=[u.max_reservations];
                    label for={ "maxs-" (u.id) } { (l.t("Most spend per hour", "每小时最高花费")) " (" (crate::console::layout::currency()) ")" }
                    input id={ "maxs-" (u.id) } name="max_spend_per_hour" type="text" inputmode="decimal"
                        value=[u.max_spend_per_hour.map(|m| m.to_string())];
                    label for={ "role-" (u.id) } { (l.t("Role", "角色")) }
                    select id={ "role-" (u.id) } name="role" {
                        @for role in [Role::Tenant, Role::Host, Role::Admin] {
                            option value=(role.as_str()) selected[role == u.role] { (role_name(l, role)) }
                        }
                    }
                    button.small type="submit" { (l.t("Save", "保存")) }
                }
                form.row method="post" action={ "/admin/users/" (id) "/password" } data-form="password" {
                    (ctx.csrf_field())
                    label for={ "pw-" (u.id) } { (l.t("New password (8 or more characters)", "新密码（至少 8 个字符）")) }
                    input id={ "pw-" (u.id) } name="password" type="password" autocomplete="new-password" minlength="8" required;
                    label for={ "mypw-" (u.id) } { (l.t("Your own password (if you logged in more than 5 minutes ago)", "您自己的密码（如果您登录已超过 5 分钟）")) }
                    input id={ "mypw-" (u.id) } name="current_password" type="password" autocomplete="current-password";
                    button.small type="submit" { (l.t("Set password", "设置密码")) }
                }
            }
        }
    }
}

/// A money field: empty is none.
fn amount(name: &str, text: &str) -> Result<Option<Money>, Failure> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<Money>().map(Some).map_err(|e| Failure {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "validation".into(),
        message: format!("{name}: {e}"),
    })
}

pub(crate) async fn create(
    State(state): State<AppState>,
    ctx: Ctx,
    Form(form): Form<CreateForm>,
) -> Result<Response, PageError> {
    let q = ListQuery::default();
    let role = match form.role.trim() {
        "" => Ok(None),
        r => r.parse::<Role>().map(Some).map_err(|e| Failure {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "validation".into(),
            message: format!("role: {e}"),
        }),
    };
    let body = match (role, amount("credit", &form.credit)) {
        (Ok(role), Ok(credit)) => CreateUser {
            name: form.name.trim().to_owned(),
            role,
            credit,
        },
        (Err(f), _) | (_, Err(f)) => return render(&state, &ctx, &q, None, Some(&f)).await,
    };
    let api = ctx.api(&state)?;
    let key = Some(form.idempotency_key.as_str()).filter(|k| !k.is_empty());
    // The token is shown on this answer and nowhere else: never put in a redirect's URL.
    match api
        .call_keyed::<_, UserCreated>(Method::POST, "/api/v1/users", &body, key)
        .await
    {
        Ok(created) => render(&state, &ctx, &q, Some(&created), None).await,
        Err(f) if f.status.is_client_error() => render(&state, &ctx, &q, None, Some(&f)).await,
        Err(f) => Err(ctx.failed(f)),
    }
}

pub(crate) async fn credit(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(id): Path<String>,
    Form(form): Form<CreditForm>,
) -> Result<Response, PageError> {
    let q = ListQuery::default();
    let amount = match amount("amount", &form.amount) {
        Ok(Some(a)) => a,
        Ok(None) => {
            let f = Failure {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code: "validation".into(),
                message: "amount: required".into(),
            };
            return render(&state, &ctx, &q, None, Some(&f)).await;
        }
        Err(f) => return render(&state, &ctx, &q, None, Some(&f)).await,
    };
    let api = ctx.api(&state)?;
    let key = Some(form.idempotency_key.as_str()).filter(|k| !k.is_empty());
    let path = format!("/api/v1/users/{}/credit", enc(&id));
    match api
        .call_keyed::<_, CreditGranted>(Method::POST, &path, &GrantCredit { amount }, key)
        .await
    {
        Ok(_) => Ok(
            Redirect::to(&format!("/admin/users?done=credit&user={}", enc(&id))).into_response(),
        ),
        Err(f) if f.status.is_client_error() => render(&state, &ctx, &q, None, Some(&f)).await,
        Err(f) => Err(ctx.failed(f)),
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct PasswordForm {
    password: String,
    /// The admin's own: needed when its login is older than 5 minutes, or for its own.
    current_password: String,
}

/// Sets a user's password, so that it can log in to the console.
pub(crate) async fn password(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(id): Path<String>,
    Form(form): Form<PasswordForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let path = format!("/api/v1/users/{}/password", enc(&id));
    let body = gpurent_types::api::SetPassword {
        password: form.password,
        current_password: Some(form.current_password).filter(|p| !p.is_empty()),
    };
    match api
        .send(Method::POST, &path, serde_json::to_vec(&body).ok())
        .await
    {
        Ok(_) => Ok(
            Redirect::to(&format!("/admin/users?done=password&user={}", enc(&id))).into_response(),
        ),
        Err(f) if f.status.is_client_error() => {
            render(&state, &ctx, &ListQuery::default(), None, Some(&f)).await
        }
        Err(f) => Err(ctx.failed(f)),
    }
}

pub(crate) async fn limits(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(id): Path<String>,
    Form(form): Form<LimitsForm>,
) -> Result<Response, PageError> {
    let q = ListQuery::default();
    let max_reservations = match form.max_reservations.trim() {
        "" => Ok(None),
        n => n.parse::<u32>().map(Some).map_err(|e| Failure {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "validation".into(),
            message: format!("max_reservations: {n:?}: {e}"),
        }),
    };
    let body = match (
        max_reservations,
        amount("max_spend_per_hour", &form.max_spend_per_hour),
    ) {
        (Ok(max_reservations), Ok(max_spend_per_hour)) => UpdateUser {
            max_reservations,
            max_spend_per_hour,
            role: None,
        },
        (Err(f), _) | (_, Err(f)) => return render(&state, &ctx, &q, None, Some(&f)).await,
    };
    let body = match form.role.trim() {
        "" => body,
        r => match r.parse::<Role>() {
            Ok(role) => UpdateUser {
                role: Some(role),
                ..body
            },
            Err(e) => {
                let f = Failure {
                    status: StatusCode::UNPROCESSABLE_ENTITY,
                    code: "validation".into(),
                    message: format!("role: {e}"),
                };
                return render(&state, &ctx, &q, None, Some(&f)).await;
            }
        },
    };
    let api = ctx.api(&state)?;
    let path = format!("/api/v1/users/{}", enc(&id));
    match api.call::<_, User>(Method::PATCH, &path, &body).await {
        Ok(_) => Ok(
            Redirect::to(&format!("/admin/users?done=limits&user={}", enc(&id))).into_response(),
        ),
        Err(f) if f.status.is_client_error() => render(&state, &ctx, &q, None, Some(&f)).await,
        Err(f) => Err(ctx.failed(f)),
    }
}
