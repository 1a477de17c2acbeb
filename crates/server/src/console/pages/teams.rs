//! `/teams`: the viewer's teams with their role and each team's balance (a platform admin's:
//! every team), and the form that makes one (its maker is its first owner).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use gpurent_types::api::{CreateTeam, Team};
use gpurent_types::TeamRole;
use maud::{html, Markup};
use serde::Deserialize;

use crate::console::api::{enc, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, money, time, Ctx, PageError};
use crate::state::AppState;

/// A role in a team, in the viewer's language.
pub(crate) fn role_name(l: Lang, role: TeamRole) -> &'static str {
    match role {
        TeamRole::Owner => l.t("owner", "所有者"),
        TeamRole::Admin => l.t("admin", "管理员"),
        TeamRole::Member => l.t("member", "成员"),
        TeamRole::Viewer => l.t("viewer", "查看者"),
    }
}

/// What each role may do, said under the forms that give one.
pub(crate) fn roles_hint(l: Lang) -> Markup {
    html! {
        p.hint { (l.t(
            "An owner may do everything, moving credit in included; an admin manages the members below owner and the budget; a member reserves, stops and enters the team's instances; a viewer only looks.",
            "所有者可以做任何事，包括转入额度；管理员管理所有者以下的成员和预算；成员可以预订、停止和进入团队的实例；查看者只能查看。"
        )) }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ListQuery {
    /// What the form before this page did: `left` (the viewer left a team).
    done: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct CreateForm {
    name: String,
}

pub(crate) async fn list(
    State(state): State<AppState>,
    ctx: Ctx,
    Query(q): Query<ListQuery>,
) -> Result<Response, PageError> {
    render(&state, &ctx, q.done.as_deref(), None).await
}

/// The list, with a refused create form (what it had, and why) above it.
async fn render(
    state: &AppState,
    ctx: &Ctx,
    done: Option<&str>,
    refused: Option<(&CreateForm, &Failure)>,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(state)?;
    let teams: Vec<Team> = api.get("/api/v1/teams").await.map_err(|f| ctx.failed(f))?;
    let body = html! {
        @if done == Some("left") {
            div.alert.ok role="status" { (l.t("You left the team.", "您已退出该团队。")) }
        }
        p.hint { (l.t(
            "A team is a shared balance with members in roles: its reservations are paid from its balance, and its members see them.",
            "团队是一个共享余额，成员各有角色：团队的预订从其余额中支付，成员都能看到。"
        )) }
        @if teams.is_empty() {
            p.empty { (l.t("You are in no team yet.", "您还没有加入任何团队。")) }
        } @else {
            div.scroll {
                table.teams data-table="teams" {
                    thead { tr {
                        th scope="col" { (l.t("Team", "团队")) }
                        th scope="col" { (l.t("Your role", "您的角色")) }
                        th scope="col" { (l.t("Balance", "余额")) }
                        th scope="col" { (l.t("Created", "创建时间")) }
                    } }
                    tbody {
                        @for t in &teams {
                            tr data-team=(t.name) {
                                th scope="row" { a href={ "/teams/" (enc(&t.name)) } translate="no" { (t.name) } }
                                td data-field="role" data-role=[t.role.map(TeamRole::as_str)] {
                                    @match t.role {
                                        Some(role) => { (role_name(l, role)) }
                                        None => { span.muted { (l.t("not a member (platform admin)", "非成员（平台管理员）")) } }
                                    }
                                }
                                td data-field="balance" { (money(t.balance)) }
                                td { (time(t.created_at)) }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="create-team-h" {
            h2 id="create-team-h" { (l.t("Make a team", "创建团队")) }
            @if let Some((_, f)) = refused { (alert(l, f)) }
            form.card.narrow method="post" action="/teams" data-form="create-team" {
                (ctx.csrf_field())
                label for="team-name" { (l.t("Name", "名称")) }
                input id="team-name" name="name" type="text" maxlength="64" required autocomplete="off" spellcheck="false"
                    placeholder="lab" value=[refused.map(|(form, _)| form.name.as_str())];
                p.hint { (l.t("Letters, digits and - _ . ; unique among users and teams. You are its first owner.", "字母、数字和 - _ . ；在用户和团队中唯一。您是它的第一位所有者。")) }
                button type="submit" { (l.t("Make team", "创建团队")) }
            }
        }
    };
    let status = refused.map_or(StatusCode::OK, |(_, f)| f.status);
    Ok(ctx.page_with_status(status, l.t("Teams", "团队"), body))
}

/// Makes a team and leads to its page; a refusal shows the list again with why, the name kept.
pub(crate) async fn create(
    State(state): State<AppState>,
    ctx: Ctx,
    Form(form): Form<CreateForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let body = CreateTeam {
        name: form.name.trim().to_owned(),
    };
    match api.post::<_, Team>("/api/v1/teams", &body).await {
        Ok(team) => {
            Ok(Redirect::to(&format!("/teams/{}?done=created", enc(&team.name))).into_response())
        }
        Err(f) if f.status.is_server_error() => Err(ctx.failed(f)),
        Err(f) => render(&state, &ctx, None, Some((&form, &f))).await,
    }
}
