//! `/teams/{name}`: a team's balance, members and their roles, its budget for the month and its
//! recent reservations, with the forms the viewer's role there allows (members, credit, budget).

use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use gpurent_types::api::{CreditMoved, MoveCredit, Reservation, SetMember, Team, TeamMember};
use gpurent_types::{Money, Role, TeamRole};
use maud::{html, Markup};
use serde::Deserialize;

use super::budget_view::{self, BudgetForm, Refused, Whose};
use super::instances::gpus;
use super::teams::{role_name, roles_hint};
use crate::console::api::{enc, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, money, raw, status, time, Ctx, PageError};
use crate::state::AppState;

/// The newest reservations the viewer sees, among which the team's are listed.
const SCANNED: u32 = 100;
/// The team's reservations shown.
const SHOWN: usize = 20;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct TeamQuery {
    /// What the form before this page did: `created`, `member`, `removed`, `credit`, `budget`,
    /// `budget-removed`.
    done: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct MemberForm {
    user: String,
    role: String,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct CreditForm {
    amount: String,
    idempotency_key: String,
}

/// Which part of the page a refused form belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Members,
    Credit,
}

/// What a refused form had and why, to show again in its part of the page.
#[derive(Default)]
struct Outcome {
    failure: Option<(Part, Failure)>,
    member: MemberForm,
    credit: CreditForm,
    budget: Option<Refused>,
}

impl Outcome {
    fn status(&self) -> StatusCode {
        match (&self.failure, &self.budget) {
            (Some((_, f)), _) => f.status,
            (None, Some(r)) => r.failure.status,
            (None, None) => StatusCode::OK,
        }
    }
}

fn validation(message: String) -> Failure {
    Failure {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "validation".into(),
        message,
    }
}

pub(crate) async fn page(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Query(q): Query<TeamQuery>,
) -> Result<Response, PageError> {
    render(&state, &ctx, &name, q.done.as_deref(), Outcome::default()).await
}

/// The viewer's role for acting in the team: theirs, or an owner's for a platform admin.
fn acting(ctx: &Ctx, team: &Team) -> Option<TeamRole> {
    team.role
        .or((ctx.role() == Some(Role::Admin)).then_some(TeamRole::Owner))
}

async fn render(
    state: &AppState,
    ctx: &Ctx,
    name: &str,
    done: Option<&str>,
    outcome: Outcome,
) -> Result<Response, PageError> {
    let l = ctx.lang;
    let api = ctx.api(state)?;
    let team: Team = api
        .get(&format!("/api/v1/teams/{}", enc(name)))
        .await
        .map_err(|f| ctx.failed(f))?;
    let budget = budget_view::fetch(&api, Whose::Team(&team.name)).await;
    if let Err(f) = &budget {
        if f.status.is_server_error() {
            return Err(ctx.failed(f.clone()));
        }
    }
    let (seen, _): (Vec<Reservation>, _) = api
        .page(&format!("/api/v1/reservations?limit={SCANNED}"))
        .await
        .map_err(|f| ctx.failed(f))?;
    let theirs: Vec<&Reservation> = seen
        .iter()
        .filter(|r| r.tenant_id == team.id)
        .take(SHOWN)
        .collect();
    let role = acting(ctx, &team);
    let at_least = |least: TeamRole| role.is_some_and(|r| r.at_least(least));
    let failure = |p: Part| {
        outcome
            .failure
            .as_ref()
            .filter(|(at, _)| *at == p)
            .map(|(_, f)| alert(l, f))
    };
    let body = html! {
        @if let Some(done) = done { (done_note(l, done)) }
        div.tiles {
            div.tile { span.muted { (l.t("Balance", "余额")) } span.n data-field="team-balance" { (money(team.balance)) } }
            div.tile { span.muted { (l.t("Your role", "您的角色")) }
                span.n data-field="your-role" data-role=[team.role.map(TeamRole::as_str)] {
                    @match team.role {
                        Some(r) => { (role_name(l, r)) }
                        None => { (l.t("platform admin", "平台管理员")) }
                    }
                }
            }
            div.tile { span.muted { (l.t("Members", "成员数")) } span.n data-field="member-count" { (team.members.len()) } }
        }
        p.hint { (l.t("To reserve for this team:", "为此团队预订：")) " " (raw(&format!("gpurent reserve --team {} ...", team.name))) }
        (members(ctx, &team, role, failure(Part::Members), &outcome.member))
        @if at_least(TeamRole::Owner) {
            (credit_form(ctx, &team, failure(Part::Credit), &outcome.credit))
        }
        (budget_view::section(ctx, &budget_view::Section {
            whose: Whose::Team(&team.name),
            budget: &budget,
            may_set: at_least(TeamRole::Admin),
            refused: outcome.budget.as_ref(),
        }))
        (reservations(l, &team, &theirs))
    };
    let title = format!("{} {}", l.t("Team", "团队"), team.name);
    Ok(ctx.page_with_status(outcome.status(), &title, body))
}

fn done_note(l: Lang, done: &str) -> Markup {
    if let Some(note) = budget_view::done_note(l, done) {
        return note;
    }
    let text = match done {
        "created" => l.t(
            "The team was made; you are its owner.",
            "团队已创建；您是它的所有者。",
        ),
        "member" => l.t("The member was saved.", "成员已保存。"),
        "removed" => l.t("The member was removed.", "成员已移除。"),
        "credit" => l.t("The credit was moved into the team.", "额度已转入团队。"),
        _ => return html! {},
    };
    html! { div.alert.ok role="status" { (text) } }
}

/// The members with their roles; for an admin or owner the form that adds one or changes a
/// role, and a remove button on each row their role may remove; for anyone, leaving.
fn members(
    ctx: &Ctx,
    team: &Team,
    role: Option<TeamRole>,
    failure: Option<Markup>,
    kept: &MemberForm,
) -> Markup {
    let l = ctx.lang;
    let me = ctx.viewer.as_ref().map(|v| v.user.name.as_str());
    let manages = role.is_some_and(|r| r.at_least(TeamRole::Admin));
    let owner = role == Some(TeamRole::Owner);
    // An admin gives and takes roles below owner; an owner any.
    let offered: &[TeamRole] = if owner {
        TeamRole::ALL
    } else {
        &[TeamRole::Admin, TeamRole::Member, TeamRole::Viewer]
    };
    let chosen = if kept.role.is_empty() {
        TeamRole::Member.as_str()
    } else {
        kept.role.as_str()
    };
    let base = format!("/teams/{}", enc(&team.name));
    html! {
        section aria-labelledby="members-h" {
            h2 id="members-h" { (l.t("Members", "成员")) }
            @if let Some(a) = failure { (a) }
            div.scroll {
                table.members data-table="members" {
                    thead { tr {
                        th scope="col" { (l.t("Name", "名称")) }
                        th scope="col" { (l.t("Role", "角色")) }
                        th scope="col" { (l.t("Added", "加入时间")) }
                        th scope="col" { span.visually-hidden { (l.t("Actions", "操作")) } }
                    } }
                    tbody {
                        @for m in &team.members {
                            @let mine = me == Some(m.name.as_str());
                            tr data-member=(m.name) {
                                th scope="row" { span translate="no" { (m.name) } @if mine { " " span.pill { (l.t("you", "您")) } } }
                                td data-field="role" data-role=(m.role.as_str()) { (role_name(l, m.role)) }
                                td { (time(m.added_at)) }
                                td { (member_action(ctx, &base, m, mine, manages && (owner || m.role != TeamRole::Owner))) }
                            }
                        }
                    }
                }
            }
            @if manages {
                form.card method="post" action={ (base) "/members" } data-form="member" {
                    (ctx.csrf_field())
                    div.grid {
                        div {
                            label for="member-user" { (l.t("User's name", "用户名")) }
                            input id="member-user" name="user" type="text" required maxlength="64" autocomplete="off" spellcheck="false" value=(kept.user);
                        }
                        div {
                            label for="member-role" { (l.t("Role", "角色")) }
                            select id="member-role" name="role" {
                                @for r in offered {
                                    option value=(r.as_str()) selected[r.as_str() == chosen] { (role_name(l, *r)) }
                                }
                            }
                        }
                    }
                    p.hint { (l.t("A user who is not a member yet is added; a member's role is changed.", "尚不是成员的用户将被添加；已是成员的用户将更改角色。")) }
                    (roles_hint(l))
                    button type="submit" { (l.t("Add or change", "添加或更改")) }
                }
            }
        }
    }
}

/// A row's button: leaving for the viewer's own row, removing for a member the viewer's role
/// may remove.
fn member_action(ctx: &Ctx, base: &str, m: &TeamMember, mine: bool, may_remove: bool) -> Markup {
    let l = ctx.lang;
    if !mine && !may_remove {
        return html! {};
    }
    let (label, question, action) = if mine {
        (
            l.t("Leave", "退出"),
            l.t(
                "Leave this team? You no longer see its reservations, and your tokens for it stop working.",
                "确定退出此团队？您将看不到它的预订，为它创建的令牌也将失效。",
            ),
            "leave-team",
        )
    } else {
        (
            l.t("Remove", "移除"),
            l.t(
                "Remove this member from the team?",
                "确定将此成员移出团队？",
            ),
            "remove-member",
        )
    };
    html! {
        form.inline method="post" action={ (base) "/members/" (enc(&m.name)) "/remove" } data-confirm=(question) {
            (ctx.csrf_field())
            button.small.danger type="submit" data-action=(action) { (label) }
        }
    }
}

fn credit_form(ctx: &Ctx, team: &Team, failure: Option<Markup>, kept: &CreditForm) -> Markup {
    let l = ctx.lang;
    // A fresh key for each form shown: a double click or a reload moves the credit once, and a
    // refused move (which moved nothing) may be tried again.
    let key = crate::auth::new_token("mov");
    html! {
        section aria-labelledby="credit-h" {
            h2 id="credit-h" { (l.t("Move credit in", "转入额度")) }
            @if let Some(a) = failure { (a) }
            form.card.narrow method="post" action={ "/teams/" (enc(&team.name)) "/credit" } data-form="credit" {
                (ctx.csrf_field())
                input type="hidden" name="idempotency_key" value=(key);
                label for="credit-amount" { (l.t("Amount", "金额")) " (" (crate::console::layout::currency()) ")" }
                input id="credit-amount" name="amount" type="text" inputmode="decimal" required placeholder="10.00" value=(kept.amount);
                p.hint { (l.t("From your own balance into the team's; it cannot be moved back.", "从您自己的余额转入团队余额；转入后不能转回。")) }
                button type="submit" { (l.t("Move credit", "转入")) }
            }
        }
    }
}

fn reservations(l: Lang, team: &Team, list: &[&Reservation]) -> Markup {
    let made_by = |r: &Reservation| {
        r.created_by.as_ref().map(|id| {
            team.members
                .iter()
                .find(|m| m.user_id == *id)
                .map_or_else(|| id.clone(), |m| m.name.clone())
        })
    };
    html! {
        section aria-labelledby="team-reservations-h" {
            h2 id="team-reservations-h" { (l.t("Recent reservations", "最近的预订")) }
            @if list.is_empty() {
                p.empty { (l.t("None among the newest you can see.", "在您能看到的最新预订中没有。")) }
            } @else {
                div.scroll {
                    table.instances data-table="team-reservations" {
                        thead { tr {
                            th scope="col" { (l.t("Instance", "实例")) }
                            th scope="col" { (l.t("Status", "状态")) }
                            th scope="col" { (l.t("GPUs", "GPU")) }
                            th scope="col" { (l.t("Made by", "创建者")) }
                            th scope="col" { (l.t("Charged", "已扣费")) }
                            th scope="col" { (l.t("Created", "创建时间")) }
                        } }
                        tbody {
                            @for r in list {
                                tr data-reservation-id=(r.id) {
                                    th scope="row" { a href={ "/instances/" (enc(&r.id)) } { (raw(&r.id)) } }
                                    td { (status(r.status.as_str())) }
                                    td { (gpus(l, r)) }
                                    td { @if let Some(who) = made_by(r) { (raw(&who)) } @else { "—" } }
                                    td { (money(r.charged)) }
                                    td { (time(r.created_at)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `POST /teams/{name}/members`: adds a user or changes their role.
pub(crate) async fn set_member(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(form): Form<MemberForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let user = form.user.trim();
    let checked = if user.is_empty() {
        Err(validation("user: required".into()))
    } else {
        form.role
            .trim()
            .parse::<TeamRole>()
            .map_err(|e| validation(format!("role: {e}")))
    };
    let result = match checked {
        Ok(role) => {
            let path = format!("/api/v1/teams/{}/members/{}", enc(&name), enc(user));
            api.call::<_, TeamMember>(Method::PUT, &path, &SetMember { role })
                .await
                .map(|_| ())
        }
        Err(f) => Err(f),
    };
    match result {
        Ok(()) => Ok(Redirect::to(&format!("/teams/{}?done=member", enc(&name))).into_response()),
        Err(f) if f.status.is_server_error() => Err(ctx.failed(f)),
        Err(f) => {
            let outcome = Outcome {
                failure: Some((Part::Members, f)),
                member: form,
                ..Outcome::default()
            };
            render(&state, &ctx, &name, None, outcome).await
        }
    }
}

/// `POST /teams/{name}/members/{user}/remove`: removes a member, or the viewer leaves.
pub(crate) async fn remove_member(
    State(state): State<AppState>,
    ctx: Ctx,
    Path((name, user)): Path<(String, String)>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let path = format!("/api/v1/teams/{}/members/{}", enc(&name), enc(&user));
    match api.send(Method::DELETE, &path, None).await {
        Ok(_) if ctx.viewer()?.user.name == user => {
            Ok(Redirect::to("/teams?done=left").into_response())
        }
        Ok(_) => Ok(Redirect::to(&format!("/teams/{}?done=removed", enc(&name))).into_response()),
        Err(f) if f.status.is_server_error() => Err(ctx.failed(f)),
        Err(f) => {
            let outcome = Outcome {
                failure: Some((Part::Members, f)),
                ..Outcome::default()
            };
            render(&state, &ctx, &name, None, outcome).await
        }
    }
}

/// `POST /teams/{name}/credit`: moves the viewer's own credit into the team, always keyed (as
/// `gpurent credit move`), so that a form sent twice moves it once.
pub(crate) async fn move_credit(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(form): Form<CreditForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    let amount = form.amount.trim();
    let amount = if amount.is_empty() {
        Err(validation("amount: required".into()))
    } else {
        amount
            .parse::<Money>()
            .map_err(|e| validation(format!("amount: {e}")))
    };
    let key = if form.idempotency_key.is_empty() {
        crate::auth::new_token("mov")
    } else {
        form.idempotency_key.clone()
    };
    let result = match amount {
        Ok(amount) => {
            let path = format!("/api/v1/teams/{}/credit", enc(&name));
            api.call_keyed::<_, CreditMoved>(
                Method::POST,
                &path,
                &MoveCredit { amount },
                Some(&key),
            )
            .await
            .map(|_| ())
        }
        Err(f) => Err(f),
    };
    match result {
        Ok(()) => Ok(Redirect::to(&format!("/teams/{}?done=credit", enc(&name))).into_response()),
        Err(f) if f.status.is_server_error() => Err(ctx.failed(f)),
        Err(f) => {
            let outcome = Outcome {
                failure: Some((Part::Credit, f)),
                credit: form,
                ..Outcome::default()
            };
            render(&state, &ctx, &name, None, outcome).await
        }
    }
}

/// `POST /teams/{name}/budget`: sets the team's budget (its admins and owners).
pub(crate) async fn set_budget(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(form): Form<BudgetForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    match budget_view::set(&ctx, &api, Whose::Team(&name), form).await? {
        Ok(()) => {
            Ok(Redirect::to(&format!("/teams/{}?done=budget#budget", enc(&name))).into_response())
        }
        Err(refused) => {
            let outcome = Outcome {
                budget: Some(refused),
                ..Outcome::default()
            };
            render(&state, &ctx, &name, None, outcome).await
        }
    }
}

/// `POST /teams/{name}/budget/remove`.
pub(crate) async fn remove_budget(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    budget_view::remove(&ctx, &api, Whose::Team(&name)).await?;
    Ok(Redirect::to(&format!("/teams/{}?done=budget-removed#budget", enc(&name))).into_response())
}
