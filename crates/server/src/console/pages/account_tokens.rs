//! The API tokens part of `/account`: the list (each token's scopes and team), the form that
//! makes one with scopes, a team and an expiry (shown once, on the page that answers it), and
//! revoking.

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use chrono::{DateTime, Utc};
use gpurent_types::api::{CreateToken, Team, Token, TokenCreated};
use gpurent_types::TokenScope;
use maud::{html, Markup};
use serde::Deserialize;

use super::account::{refused, render, Outcome, Section};
use crate::console::api::{enc, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{maybe_time, raw, time, Ctx, PageError};
use crate::state::AppState;

/// The token form as posted: a checkbox per scope (`scope_read`, ...), the team's name or
/// nothing, and the days it lasts.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct TokenForm {
    name: String,
    expires_in_days: String,
    password: String,
    team: String,
    scope_read: Option<String>,
    scope_reserve: Option<String>,
    scope_ssh: Option<String>,
    scope_volumes: Option<String>,
    scope_billing: Option<String>,
    scope_admin: Option<String>,
}

impl TokenForm {
    fn has(&self, scope: TokenScope) -> bool {
        match scope {
            TokenScope::Read => self.scope_read.is_some(),
            TokenScope::Reserve => self.scope_reserve.is_some(),
            TokenScope::Ssh => self.scope_ssh.is_some(),
            TokenScope::Volumes => self.scope_volumes.is_some(),
            TokenScope::Billing => self.scope_billing.is_some(),
            TokenScope::Admin => self.scope_admin.is_some(),
        }
    }

    /// What a refused form shows again: all but the password.
    fn without_password(mut self) -> TokenForm {
        self.password = String::new();
        self
    }
}

/// What a scope lets a token do, in the viewer's language.
fn scope_words(l: Lang, scope: TokenScope) -> &'static str {
    match scope {
        TokenScope::Read => l.t("see everything you see", "查看您能看到的一切"),
        TokenScope::Reserve => l.t("make and stop reservations", "创建和停止预订"),
        TokenScope::Ssh => l.t("enter instances", "进入实例"),
        TokenScope::Volumes => l.t("manage volumes and their files", "管理存储卷及其文件"),
        TokenScope::Billing => l.t("read balances, usage and invoices", "查看余额、用量和账单"),
        TokenScope::Admin => l.t("manage a team's members and budget", "管理团队的成员和预算"),
    }
}

fn token_state(l: Lang, t: &Token, now: DateTime<Utc>) -> (&'static str, &'static str) {
    if t.revoked_at.is_some() {
        ("revoked", l.t("revoked", "已吊销"))
    } else if t.expires_at.is_some_and(|e| e <= now) {
        ("expired", l.t("expired", "已过期"))
    } else {
        ("ready", l.t("valid", "有效"))
    }
}

/// What the tokens part is given.
pub(super) struct Tokens<'a> {
    pub tokens: &'a [Token],
    pub more: bool,
    pub teams: &'a [Team],
    pub admin: bool,
    pub now: DateTime<Utc>,
}

/// The tokens section: the token just made, the list, and the form (with what was refused).
pub(super) fn section(
    ctx: &Ctx,
    t: &Tokens<'_>,
    outcome: &Outcome,
    failure: Option<Markup>,
) -> Markup {
    let l = ctx.lang;
    let kept = outcome.token_form.clone().unwrap_or_default();
    html! {
        section aria-labelledby="tokens-h" {
            h2 id="tokens-h" { (l.t("API tokens", "API 令牌")) }
            @if let Some(created) = &outcome.created { (new_token(l, created)) }
            (tokens_table(ctx, t))
            @if t.more { p.hint { (l.t("Only the newest are listed here; the command line lists all of them.", "此处只列出最新的；命令行可列出全部。")) } }
            @if let Some(a) = failure { (a) }
            form.card method="post" action="/account/tokens" data-form="token" {
                (ctx.csrf_field())
                div.grid {
                    div {
                        label for="token_name" { (l.t("Name", "名称")) }
                        input id="token_name" name="name" type="text" maxlength="100" placeholder="ci" value=(kept.name);
                    }
                    div {
                        label for="expires_in_days" { (l.t("Expires after (days, optional)", "有效天数（可选）")) }
                        input id="expires_in_days" name="expires_in_days" type="number" min="1" max="3650" value=(kept.expires_in_days);
                    }
                    div {
                        label for="token_team" { (l.t("Acts for a team", "代表团队")) }
                        select id="token_team" name="team" {
                            option value="" selected[kept.team.is_empty()] { (l.t("none: your own account", "无：您自己的账户")) }
                            @for team in t.teams {
                                option value=(team.name) selected[kept.team == team.name] translate="no" { (team.name) }
                            }
                        }
                    }
                    div {
                        label for="token_password" { (l.t("Your password", "您的密码")) }
                        input id="token_password" name="password" type="password" autocomplete="current-password" required;
                    }
                }
                fieldset.checks data-field="scopes" {
                    legend { (l.t("Scopes (none ticked: everything you may do)", "权限范围（不勾选：您能做的一切）")) }
                    @for scope in TokenScope::ALL {
                        label {
                            input type="checkbox" name={ "scope_" (scope.as_str()) } value="on" checked[kept.has(*scope)];
                            " " (raw(scope.as_str())) " " (scope_words(l, *scope))
                        }
                    }
                }
                p.hint { (l.t("With your password the token is a credential of its own: logging out does not end it.", "输入密码后，令牌独立有效：退出登录不会使其失效。")) }
                p.hint { (l.t("A token for a team acts for it alone: its reservations are the team's, and it reaches nothing of your own account. Its scopes must be within your role there.", "代表团队的令牌只为该团队操作：它的预订属于团队，且无法访问您自己的账户。其权限范围不能超出您在团队中的角色。")) }
                button type="submit" { (l.t("Create token", "创建令牌")) }
            }
        }
    }
}

fn tokens_table(ctx: &Ctx, t: &Tokens<'_>) -> Markup {
    let l = ctx.lang;
    let this_session = ctx.viewer.as_ref().map(|v| v.token_id.as_str());
    let team_name = |id: &str| {
        t.teams
            .iter()
            .find(|team| team.id == id)
            .map_or_else(|| id.to_owned(), |team| team.name.clone())
    };
    html! {
        @if t.tokens.is_empty() {
            p.empty { (l.t("No tokens yet.", "还没有令牌。")) }
        } @else {
            div.scroll {
                table.tokens {
                    thead { tr {
                        th scope="col" { (l.t("Name", "名称")) }
                        @if t.admin { th scope="col" { (l.t("User", "用户")) } }
                        th scope="col" { (l.t("Kind", "类型")) }
                        th scope="col" { (l.t("Scopes", "权限范围")) }
                        th scope="col" { (l.t("Team", "团队")) }
                        th scope="col" { (l.t("State", "状态")) }
                        th scope="col" { (l.t("Created", "创建时间")) }
                        th scope="col" { (l.t("Expires", "过期时间")) }
                        th scope="col" { (l.t("Revoked", "吊销时间")) }
                        th scope="col" { span.visually-hidden { (l.t("Actions", "操作")) } }
                    } }
                    tbody {
                        @for tok in t.tokens {
                            @let (word, shown) = token_state(l, tok, t.now);
                            tr data-token-id=(tok.id) {
                                th scope="row" {
                                    @if let Some(name) = &tok.name { (raw(name)) } @else { span.muted { (l.t("unnamed", "未命名")) } }
                                    @if this_session == Some(tok.id.as_str()) { " " span.pill { (l.t("this session", "当前会话")) } }
                                }
                                @if t.admin { td { (raw(&tok.user_id)) } }
                                td { @if tok.kind == "session" { (l.t("login session", "登录会话")) } @else { (l.t("API token", "API 令牌")) } }
                                td data-field="scopes" {
                                    @match &tok.scopes {
                                        Some(scopes) => { (raw(&scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","))) }
                                        None => { span.muted { (l.t("all", "全部")) } }
                                    }
                                }
                                td data-field="team" {
                                    @match &tok.team_id {
                                        Some(id) => { (raw(&team_name(id))) }
                                        None => { "—" }
                                    }
                                }
                                td { span.status data-status=(word) { (shown) } }
                                td { (time(tok.created_at)) }
                                td { @if tok.expires_at.is_some() { (maybe_time(tok.expires_at)) } @else { (l.t("never", "永不过期")) } }
                                td { (maybe_time(tok.revoked_at)) }
                                td {
                                    @if word == "ready" {
                                        form method="post" action={ "/account/tokens/" (enc(&tok.id)) "/revoke" }
                                            data-confirm=(if this_session == Some(tok.id.as_str()) {
                                                l.t("This is the session you are using: revoking it logs you out. Revoke it?", "这是您当前使用的会话：吊销后将退出登录。确定吊销？")
                                            } else {
                                                l.t("Revoke this token? Requests with it are refused from now on.", "确定吊销此令牌？此后使用它的请求将被拒绝。")
                                            }) {
                                            (ctx.csrf_field())
                                            button.small.danger type="submit" data-action="revoke-token" { (l.t("Revoke", "吊销")) }
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
}

/// The token just made: on this page only, never again (the API keeps only its hash).
fn new_token(l: Lang, created: &TokenCreated) -> Markup {
    html! {
        div.alert.ok role="status" data-field="new-token" {
            p { strong { (l.t("Your new token. Copy it now: it is not shown again.", "您的新令牌。请立即复制：它不会再次显示。")) } }
            p.secret { code data-field="token" { (created.token) } " "
                button.small.secondary type="button" data-copy=(created.token) { (l.t("Copy", "复制")) } }
            p.hint { (l.t("For the command line:", "命令行用法：")) " " (raw("GPURENT_TOKEN=TOKEN")) " " (l.t("or", "或")) " " (raw("--token TOKEN")) }
        }
    }
}

/// Makes a token and answers with the account page showing it, once: it is in no URL and no
/// redirect, and the page is never cached (`Cache-Control: no-store`).
pub(crate) async fn create_token(
    State(state): State<AppState>,
    ctx: Ctx,
    Form(form): Form<TokenForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let kept = Outcome {
        token_form: Some(form.clone().without_password()),
        ..Outcome::default()
    };
    let body = match token_body(form) {
        Ok(body) => body,
        Err(f) => return refused(&state, &ctx, Section::Tokens, f, kept).await,
    };
    match api.post::<_, TokenCreated>("/api/v1/tokens", &body).await {
        Ok(created) => {
            let outcome = Outcome {
                created: Some(created),
                ..Outcome::default()
            };
            render(&state, &ctx, StatusCode::OK, outcome).await
        }
        Err(f) => refused(&state, &ctx, Section::Tokens, f, kept).await,
    }
}

fn validation(message: impl Into<String>) -> Failure {
    Failure {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "validation".into(),
        message: message.into(),
    }
}

fn token_body(form: TokenForm) -> Result<CreateToken, Failure> {
    let days = form.expires_in_days.trim();
    let expires_in_days = if days.is_empty() {
        None
    } else {
        Some(days.parse::<u32>().map_err(|_| {
            validation(format!("expires_in_days: {days:?} is not a number of days"))
        })?)
    };
    // Without the password the API binds the token to this login session, which logging out
    // revokes: not what a token made for a script is for.
    if form.password.is_empty() {
        return Err(validation(
            "password: needed, so that the token outlives this login session",
        ));
    }
    // None ticked: a token that may do everything its maker may (the API's default).
    let scopes: Vec<TokenScope> = TokenScope::ALL
        .iter()
        .copied()
        .filter(|s| form.has(*s))
        .collect();
    let team = form.team.trim();
    Ok(CreateToken {
        name: Some(form.name.trim().to_owned()).filter(|n| !n.is_empty()),
        expires_in_days,
        password: Some(form.password),
        scopes: (!scopes.is_empty()).then_some(scopes),
        team: (!team.is_empty()).then(|| team.to_owned()),
    })
}

pub(crate) async fn revoke_token(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let path = format!("/api/v1/tokens/{}", enc(&id));
    api.send(Method::DELETE, &path, None)
        .await
        .map_err(|f| ctx.failed(f))?;
    Ok(Redirect::to("/account?done=token-revoked").into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(days: &str, password: &str) -> TokenForm {
        TokenForm {
            name: " ci ".into(),
            expires_in_days: days.into(),
            password: password.into(),
            ..TokenForm::default()
        }
    }

    #[test]
    fn a_token_form_needs_a_password_and_days_that_are_a_number() {
        let body = token_body(form("30", "pw")).unwrap();
        assert_eq!(body.name.as_deref(), Some("ci"));
        assert_eq!(body.expires_in_days, Some(30));
        assert_eq!(body.password.as_deref(), Some("pw"));
        assert_eq!(body.scopes, None);
        assert_eq!(body.team, None);
        assert_eq!(token_body(form("", "pw")).unwrap().expires_in_days, None);
        assert!(token_body(form("soon", "pw"))
            .unwrap_err()
            .message
            .contains("not a number"));
        assert!(token_body(form("", ""))
            .unwrap_err()
            .message
            .starts_with("password"));
    }

    #[test]
    fn ticked_scopes_and_a_team_are_asked_for() {
        let ticked = TokenForm {
            team: " lab ".into(),
            scope_reserve: Some("on".into()),
            scope_read: Some("on".into()),
            ..form("7", "pw")
        };
        let body = token_body(ticked.clone()).unwrap();
        assert_eq!(
            body.scopes,
            Some(vec![TokenScope::Read, TokenScope::Reserve])
        );
        assert_eq!(body.team.as_deref(), Some("lab"));
        let kept = ticked.without_password();
        assert!(kept.password.is_empty() && kept.has(TokenScope::Reserve));
        assert!(!kept.has(TokenScope::Admin));
    }
}
