//! `/account`: the viewer's SSH keys (add, remove), API tokens (`account_tokens.rs`) and
//! password; the sensitive ones need the password (`reauth`).

use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use gpurent_types::api::{AddSshKey, SetPassword, SshKey, Team, Token, TokenCreated};
use gpurent_types::Role;
use maud::{html, Markup};
use serde::Deserialize;

use super::account_tokens::{self, TokenForm, Tokens};
use crate::console::api::{enc, Api, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, raw, time, Ctx, PageError};
use crate::reauth::FRESH_LOGIN;
use crate::state::AppState;

/// Keys and tokens listed (the newest first); the CLI lists every one.
const LIST: u32 = 100;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct AccountQuery {
    /// What the form before this page did: `key`, `key-removed`, `token-revoked`, `password`.
    done: Option<String>,
}

/// What a form of this page asked for and how it went, to show above the lists.
#[derive(Default)]
pub(super) struct Outcome {
    pub done: Option<String>,
    pub failure: Option<(Section, Failure)>,
    pub created: Option<TokenCreated>,
    /// What the token form had (not the password), shown again when it was refused.
    pub token_form: Option<TokenForm>,
    /// What the SSH key form had, shown again when it was refused.
    pub key_text: String,
    /// The key form was refused for want of the password: show its field.
    pub key_needs_password: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
    Keys,
    Tokens,
    Password,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<AccountQuery>,
) -> Result<Response, PageError> {
    let outcome = Outcome {
        done: q.done,
        ..Outcome::default()
    };
    render(&state, &ctx, StatusCode::OK, outcome).await
}

pub(super) async fn render(
    state: &AppState,
    ctx: &Ctx,
    status: StatusCode,
    outcome: Outcome,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(state)?;
    let (keys, more_keys): (Vec<SshKey>, _) = api
        .page(&format!("/api/v1/ssh-keys?limit={LIST}"))
        .await
        .map_err(|f| ctx.failed(f))?;
    let (tokens, more_tokens): (Vec<Token>, _) = api
        .page(&format!("/api/v1/tokens?limit={LIST}"))
        .await
        .map_err(|f| ctx.failed(f))?;
    // For the token form's team and the list's team names.
    let teams: Vec<Team> = api.get("/api/v1/teams").await.map_err(|f| ctx.failed(f))?;
    let admin = ctx.role() == Some(Role::Admin);
    let failure = |s: Section| {
        outcome
            .failure
            .as_ref()
            .filter(|(at, _)| *at == s)
            .map(|(_, f)| alert(l, f))
    };
    let now = state.now();
    // A session older than this needs the password to add a key (`reauth.rs`); the field is
    // shown a minute early, so that a form filled in slowly still carries it.
    let key_needs_password = outcome.key_needs_password
        || ctx
            .viewer
            .as_ref()
            .and_then(|v| v.login_at)
            .is_some_and(|at| now - at >= FRESH_LOGIN - chrono::Duration::minutes(1));
    let body = html! {
        @if let Some(done) = &outcome.done { (done_note(l, done)) }
        section aria-labelledby="keys-h" {
            h2 id="keys-h" { (l.t("SSH keys", "SSH 密钥")) }
            p.hint { (l.t("Your keys get you into your running instances:", "这些密钥可登录您运行中的实例：")) " " (raw("gpurent ssh ID")) }
            (keys_table(ctx, &keys, admin))
            @if more_keys.is_some() { p.hint { (l.t("Only the newest are listed here; the command line lists all of them.", "此处只列出最新的；命令行可列出全部。")) } }
            @if let Some(a) = failure(Section::Keys) { (a) }
            form.card method="post" action="/account/ssh-keys" data-form="ssh-key" {
                (ctx.csrf_field())
                label for="public_key" { (l.t("Public key (one line), as in", "公钥（一行），即此文件的内容：")) " " (raw("~/.ssh/id_ed25519.pub")) }
                textarea id="public_key" name="public_key" rows="3" required spellcheck="false" { (outcome.key_text) }
                label for="key_name" { (l.t("Name (optional; the key's comment by default)", "名称（可选，默认为密钥的注释）")) }
                input id="key_name" name="name" type="text" maxlength="100";
                @if key_needs_password {
                    label for="key_password" { (l.t("Your password (you logged in more than 5 minutes ago)", "您的密码（您登录已超过 5 分钟）")) }
                    input id="key_password" name="password" type="password" autocomplete="current-password" required;
                }
                button type="submit" { (l.t("Add key", "添加密钥")) }
            }
        }
        (account_tokens::section(ctx, &Tokens {
            tokens: &tokens,
            more: more_tokens.is_some(),
            teams: &teams,
            admin,
            now,
        }, &outcome, failure(Section::Tokens)))
        section aria-labelledby="password-h" {
            h2 id="password-h" { (l.t("Password", "密码")) }
            @if let Some(a) = failure(Section::Password) { (a) }
            form.card.narrow method="post" action="/account/password" data-form="password" {
                (ctx.csrf_field())
                label for="current_password" { (l.t("Current password", "当前密码")) }
                input id="current_password" name="current_password" type="password" autocomplete="current-password" maxlength="1024" required;
                label for="new_password" { (l.t("New password (8 characters or more)", "新密码（至少 8 个字符）")) }
                input id="new_password" name="password" type="password" autocomplete="new-password" minlength="8" maxlength="1024" required;
                label for="repeat_password" { (l.t("The new password again", "再次输入新密码")) }
                input id="repeat_password" name="repeat" type="password" autocomplete="new-password" minlength="8" maxlength="1024" required;
                p.hint { (l.t("Changing it logs out your other sessions.", "修改后，您的其他登录会话将退出。")) }
                button type="submit" { (l.t("Change password", "修改密码")) }
            }
        }
    };
    Ok(ctx.page_with_status(status, l.t("Account", "账户"), body))
}

fn done_note(l: Lang, done: &str) -> Markup {
    let text = match done {
        "key" => l.t("The key was added.", "密钥已添加。"),
        "key-removed" => l.t("The key was removed.", "密钥已删除。"),
        "token-revoked" => l.t("The token was revoked.", "令牌已吊销。"),
        "password" => l.t(
            "Your password was changed; your other sessions were logged out.",
            "密码已修改；您的其他会话已退出。",
        ),
        _ => return html! {},
    };
    html! { div.alert.ok role="status" { (text) } }
}

fn keys_table(ctx: &Ctx, keys: &[SshKey], admin: bool) -> Markup {
    let l = ctx.lang;
    html! {
        @if keys.is_empty() {
            p.empty { (l.t("No SSH keys yet.", "还没有 SSH 密钥。")) }
        } @else {
            div.scroll {
                table.keys {
                    thead { tr {
                        th scope="col" { (l.t("Name", "名称")) }
                        @if admin { th scope="col" { (l.t("User", "用户")) } }
                        th scope="col" { (l.t("Kind", "类型")) }
                        th scope="col" { (l.t("Fingerprint", "指纹")) }
                        th scope="col" { (l.t("Added", "添加时间")) }
                        th scope="col" { span.visually-hidden { (l.t("Actions", "操作")) } }
                    } }
                    tbody {
                        @for k in keys {
                            tr data-ssh-key-id=(k.id) {
                                th scope="row" { (raw(&k.name)) }
                                @if admin { td { (raw(&k.user_id)) } }
                                td { (raw(&k.algorithm)) }
                                td { (raw(&k.fingerprint)) }
                                td { (time(k.created_at)) }
                                td {
                                    form method="post" action={ "/account/ssh-keys/" (enc(&k.id)) "/remove" }
                                        data-confirm=(l.t("Remove this key? It gets into nothing from now on.", "确定删除此密钥？此后它将无法登录任何实例。")) {
                                        (ctx.csrf_field())
                                        button.small.danger type="submit" data-action="remove-key" { (l.t("Remove", "删除")) }
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

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct KeyForm {
    public_key: String,
    name: String,
    password: String,
}

pub(crate) async fn add_key(
    State(state): State<AppState>,
    ctx: Ctx,
    Form(form): Form<KeyForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let body = AddSshKey {
        public_key: form.public_key.trim().to_owned(),
        name: Some(form.name.trim().to_owned()).filter(|n| !n.is_empty()),
        password: Some(form.password).filter(|p| !p.is_empty()),
    };
    match api.post::<_, SshKey>("/api/v1/ssh-keys", &body).await {
        Ok(_) => Ok(Redirect::to("/account?done=key").into_response()),
        Err(f) => {
            let key_needs_password =
                matches!(f.code.as_str(), "password_required" | "wrong_password");
            refused(
                &state,
                &ctx,
                Section::Keys,
                f,
                Outcome {
                    key_text: form.public_key,
                    key_needs_password,
                    ..Outcome::default()
                },
            )
            .await
        }
    }
}

pub(crate) async fn remove_key(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let path = format!("/api/v1/ssh-keys/{}", enc(&id));
    api.send(Method::DELETE, &path, None)
        .await
        .map_err(|f| ctx.failed(f))?;
    Ok(Redirect::to("/account?done=key-removed").into_response())
}

fn validation(message: impl Into<String>) -> Failure {
    Failure {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "validation".into(),
        message: message.into(),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct PasswordForm {
    current_password: String,
    password: String,
    repeat: String,
}

pub(crate) async fn change_password(
    State(state): State<AppState>,
    ctx: Ctx,
    Form(form): Form<PasswordForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    if form.password != form.repeat {
        let f = validation("the two passwords differ");
        return refused(&state, &ctx, Section::Password, f, Outcome::default()).await;
    }
    let body = SetPassword {
        password: form.password,
        current_password: Some(form.current_password).filter(|p| !p.is_empty()),
    };
    match set_password(&api, &body).await {
        Ok(()) => Ok(Redirect::to("/account?done=password").into_response()),
        Err(f) => refused(&state, &ctx, Section::Password, f, Outcome::default()).await,
    }
}

async fn set_password(api: &Api, body: &SetPassword) -> Result<(), Failure> {
    let json = serde_json::to_vec(body).map_err(|e| Failure::internal(e.to_string()))?;
    api.send(Method::POST, "/api/v1/users/me/password", Some(json))
        .await
        .map(|_| ())
}

/// The page again, with why a form was refused above it; a failure of the control plane
/// itself is an error page.
pub(super) async fn refused(
    state: &AppState,
    ctx: &Ctx,
    section: Section,
    failure: Failure,
    outcome: Outcome,
) -> Result<Response, PageError> {
    if failure.status.is_server_error() {
        return Err(ctx.failed(failure));
    }
    let status = failure.status;
    let outcome = Outcome {
        failure: Some((section, failure)),
        ..outcome
    };
    render(state, ctx, status, outcome).await
}
