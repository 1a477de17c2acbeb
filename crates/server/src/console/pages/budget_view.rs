//! A monthly budget as the billing and team pages show it (spent against the budget, the
//! forecast, the alerts fired), its set/remove form, and the billing page's own budget forms.

use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use gpurent_types::api::{BudgetStatus, SetBudget};
use gpurent_types::Money;
use maud::{html, Markup};
use serde::Deserialize;

use crate::console::api::{enc, Api, Failure};
use crate::console::lang::Lang;
use crate::console::layout::{alert, money, raw, time, Ctx, PageError};
use crate::state::AppState;

/// Whose budget a section shows: the viewer's own, or a team's by name.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Whose<'a> {
    Own,
    Team(&'a str),
}

impl Whose<'_> {
    /// The API's `?team=` for it.
    fn query(self) -> String {
        match self {
            Whose::Own => String::new(),
            Whose::Team(name) => format!("?team={}", enc(name)),
        }
    }

    /// Where its forms post: `.../budget` sets it, `.../budget/remove` removes it.
    fn action(self) -> String {
        match self {
            Whose::Own => "/billing/budget".to_owned(),
            Whose::Team(name) => format!("/teams/{}/budget", enc(name)),
        }
    }
}

/// The budget form as posted: every field text, as a browser sends it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct BudgetForm {
    monthly: String,
    /// Percentages, separated by commas or spaces.
    alert_at: String,
    stop_at_limit: Option<String>,
    low_balance_hours: String,
}

/// A budget form that was refused: what it had, and why.
#[derive(Debug)]
pub(crate) struct Refused {
    pub form: BudgetForm,
    pub failure: Failure,
}

fn validation(message: String) -> Failure {
    Failure {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "validation".into(),
        message,
    }
}

impl BudgetForm {
    /// The API's body; a field it cannot take says which.
    fn to_api(&self, team: Option<&str>) -> Result<SetBudget, Failure> {
        let monthly = self.monthly.trim();
        if monthly.is_empty() {
            return Err(validation("monthly: required".into()));
        }
        let monthly = monthly
            .parse::<Money>()
            .map_err(|e| validation(format!("monthly: {e}")))?;
        let alert_at = self
            .alert_at
            .split(|c: char| c == ',' || c.is_whitespace())
            .map(|p| p.trim().trim_end_matches('%'))
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse::<u32>()
                    .map_err(|_| validation(format!("alert_at: {p:?} is not a percentage")))
            })
            .collect::<Result<Vec<u32>, Failure>>()?;
        let hours = self.low_balance_hours.trim();
        let low_balance_hours = if hours.is_empty() {
            None
        } else {
            Some(hours.parse::<u32>().map_err(|_| {
                validation(format!(
                    "low_balance_hours: {hours:?} is not a number of hours"
                ))
            })?)
        };
        Ok(SetBudget {
            team: team.map(str::to_owned),
            monthly,
            alert_at: (!alert_at.is_empty()).then_some(alert_at),
            stop_at_limit: self.stop_at_limit.is_some(),
            low_balance_hours,
        })
    }

    /// The form filled with a budget as it is.
    fn of(b: &BudgetStatus) -> BudgetForm {
        BudgetForm {
            monthly: b.monthly.to_string(),
            alert_at: b
                .alert_at
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            stop_at_limit: b.stop_at_limit.then(|| "on".to_owned()),
            low_balance_hours: b.low_balance_hours.to_string(),
        }
    }
}

/// The budget, or none (the API's 404); another refusal is said in its section, a failure of
/// the control plane is the caller's error page.
pub(crate) async fn fetch(api: &Api, whose: Whose<'_>) -> Result<Option<BudgetStatus>, Failure> {
    match api
        .get::<BudgetStatus>(&format!("/api/v1/budget{}", whose.query()))
        .await
    {
        Ok(b) => Ok(Some(b)),
        Err(f) if f.status == StatusCode::NOT_FOUND => Ok(None),
        Err(f) => Err(f),
    }
}

/// What a section is given: the budget as read, whether the viewer may set it, and a refused
/// form to show again.
pub(crate) struct Section<'a> {
    pub whose: Whose<'a>,
    pub budget: &'a Result<Option<BudgetStatus>, Failure>,
    pub may_set: bool,
    pub refused: Option<&'a Refused>,
}

/// The month's spend against the budget, the forecast and the alerts fired, then its form.
pub(crate) fn section(ctx: &Ctx, s: &Section<'_>) -> Markup {
    let l = ctx.lang;
    html! {
        section id="budget" aria-labelledby="budget-h" {
            h2 id="budget-h" { (l.t("Monthly budget", "月度预算")) }
            @match s.budget {
                Ok(Some(b)) => { (view(l, b)) }
                Ok(None) => { p.empty data-field="no-budget" { (l.t("No budget is set: spending is limited by the balance alone.", "尚未设置预算：支出只受余额限制。")) } }
                Err(f) => { (alert(l, f)) }
            }
            @if s.may_set { (form(ctx, s)) }
        }
    }
}

/// Spent against the budget, as figures and a meter; `over` in words that cannot be missed.
fn view(l: Lang, b: &BudgetStatus) -> Markup {
    let percent = percent_of(b.spent, b.monthly);
    html! {
        @if b.over {
            div.alert.error role="alert" data-field="budget-over" {
                strong { (l.t("Over budget.", "已超出预算。")) } " "
                (l.t("New reservations are refused until next month or until the budget is raised.", "在下个月之前或提高预算之前，新的预订将被拒绝。"))
                @if b.stop_at_limit { " " (l.t("Running reservations were stopped.", "运行中的预订已被停止。")) }
            }
        }
        div.tiles data-month=(b.month) {
            div.tile { span.muted { (l.t("Budget for", "预算月份")) " " (b.month) } span.n data-field="budget-monthly" { (money(b.monthly)) } }
            div.tile { span.muted { (l.t("Spent this month", "本月已支出")) } span.n data-field="budget-spent" { (money(b.spent)) } }
            div.tile { span.muted { (l.t("Forecast for the month", "本月预测支出")) } span.n.warn[b.forecast > b.monthly] data-field="budget-forecast" { (money(b.forecast)) } }
            div.tile { span.muted { (l.t("Spending per hour now", "当前每小时支出")) } span.n data-field="budget-burn" { (money(b.burn_per_hour)) } }
        }
        p {
            label for="budget-meter" { (l.t("Spent of the budget:", "预算已用：")) " " span data-field="budget-percent" { (percent) "%" } }
            " "
            meter id="budget-meter" min="0" max="100" low="80" high="100" optimum="0" value=(percent.min(100)) { (percent) "%" }
        }
        @if b.forecast > b.monthly && !b.over {
            p.warn data-field="budget-forecast-over" { (l.t("At the current rate the month will spend more than the budget.", "按当前速度，本月支出将超出预算。")) }
        }
        p.hint {
            (l.t("Alerts at", "提醒阈值：")) " " (b.alert_at.iter().map(|p| format!("{p}%")).collect::<Vec<_>>().join(", "))
            @if b.low_balance_hours > 0 {
                " · " (l.t("and when the balance covers fewer hours than", "余额可支撑的小时数少于此值时也提醒：")) " " (b.low_balance_hours)
            }
            " · "
            @if b.stop_at_limit { (l.t("running reservations stop at the limit", "达到上限时停止运行中的预订")) }
            @else { (l.t("running reservations go on at the limit", "达到上限时运行中的预订继续运行")) }
        }
        h3 { (l.t("Alerts this month", "本月提醒")) }
        @if b.alerts.is_empty() {
            p.empty data-field="no-alerts" { (l.t("None fired yet.", "尚未触发。")) }
        } @else {
            div.scroll {
                table.alerts data-table="budget-alerts" {
                    thead { tr {
                        th scope="col" { (l.t("Alert", "提醒")) }
                        th scope="col" { (l.t("Spent then", "当时支出")) }
                        th scope="col" { (l.t("Fired", "触发时间")) }
                    } }
                    tbody {
                        @for a in &b.alerts {
                            tr data-alert=(a.alert) {
                                th scope="row" { (alert_name(l, &a.alert)) }
                                td { (money(a.spent)) }
                                td { (time(a.fired_at)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `80` as `80% of the budget`; `low_balance` in words; anything else as the API says it.
fn alert_name(l: Lang, alert: &str) -> Markup {
    if alert == "low_balance" {
        return html! { (l.t("Low balance", "余额不足")) };
    }
    if alert.parse::<u32>().is_ok() {
        return html! { (alert) "% " (l.t("of the budget", "的预算")) };
    }
    raw(alert)
}

/// `spent` as a whole percentage of `monthly`, cut (integers only: money never becomes a float).
fn percent_of(spent: Money, monthly: Money) -> i64 {
    if monthly.micros() <= 0 {
        return 0;
    }
    let p = i128::from(spent.micros().max(0)) * 100 / i128::from(monthly.micros());
    i64::try_from(p).unwrap_or(i64::MAX)
}

/// The set form (filled with the budget as it is, or with what was refused) and the remove
/// button.
fn form(ctx: &Ctx, s: &Section<'_>) -> Markup {
    let l = ctx.lang;
    let current = s.budget.as_ref().ok().and_then(Option::as_ref);
    let kept = match (s.refused, current) {
        (Some(r), _) => r.form.clone(),
        (None, Some(b)) => BudgetForm::of(b),
        (None, None) => BudgetForm::default(),
    };
    let action = s.whose.action();
    html! {
        @if let Some(r) = s.refused { (alert(l, &r.failure)) }
        form.card method="post" action=(action) data-form="budget" {
            (ctx.csrf_field())
            div.grid {
                div {
                    label for="budget-monthly-in" { (l.t("Monthly budget", "每月预算")) " (" (crate::console::layout::currency()) ")" }
                    input id="budget-monthly-in" name="monthly" type="text" inputmode="decimal" required placeholder="500.00" value=(kept.monthly);
                }
                div {
                    label for="budget-alert-at" { (l.t("Alerts at (% of the budget)", "提醒阈值（预算的百分比）")) }
                    input id="budget-alert-at" name="alert_at" type="text" placeholder="50, 80, 100" value=(kept.alert_at);
                }
                div {
                    label for="budget-low-hours" { (l.t("Low-balance alert (hours left; 0: never)", "余额不足提醒（剩余小时数；0 为从不）")) }
                    input id="budget-low-hours" name="low_balance_hours" type="number" min="0" placeholder="24" value=(kept.low_balance_hours);
                }
            }
            fieldset.checks {
                legend { (l.t("At the limit", "达到上限时")) }
                label { input type="checkbox" name="stop_at_limit" checked[kept.stop_at_limit.is_some()]; " " (l.t("Stop running reservations (reserved blocks, already paid, never)", "停止运行中的预订（已付费的预留时段除外）")) }
            }
            p.hint { (l.t("New reservations are refused once the month's spend reaches the budget; a budget below what the month already spent refuses them at once.", "本月支出达到预算后，新的预订将被拒绝；预算低于本月已支出时立即拒绝。")) }
            div.actions {
                button type="submit" { @if current.is_some() { (l.t("Change budget", "修改预算")) } @else { (l.t("Set budget", "设置预算")) } }
                @if current.is_some() {
                    button.danger type="submit" form="budget-remove" data-action="remove-budget" { (l.t("Remove budget", "删除预算")) }
                }
            }
        }
        // Its button sits in the set form's card (`form=`): forms cannot nest.
        @if current.is_some() {
            form id="budget-remove" method="post" action={ (action) "/remove" } data-form="budget-remove"
                data-confirm=(l.t("Remove this budget? Spending is then limited by the balance alone.", "确定删除此预算？之后支出只受余额限制。")) {
                (ctx.csrf_field())
            }
        }
    }
}

/// Sets the budget; a refusal is the form again with why (`Err`), a failure of the control
/// plane an error page.
pub(crate) async fn set(
    ctx: &Ctx,
    api: &Api,
    whose: Whose<'_>,
    form: BudgetForm,
) -> Result<Result<(), Refused>, PageError> {
    let team = match whose {
        Whose::Own => None,
        Whose::Team(name) => Some(name),
    };
    let body = match form.to_api(team) {
        Ok(body) => body,
        Err(failure) => return Ok(Err(Refused { form, failure })),
    };
    match api
        .call::<_, BudgetStatus>(Method::PUT, "/api/v1/budget", &body)
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(f) if f.status.is_server_error() => Err(ctx.failed(f)),
        Err(failure) => Ok(Err(Refused { form, failure })),
    }
}

/// Removes the budget; what the API refuses is an error page (the page had a remove button
/// only for a budget it showed).
pub(crate) async fn remove(ctx: &Ctx, api: &Api, whose: Whose<'_>) -> Result<(), PageError> {
    api.send(
        Method::DELETE,
        &format!("/api/v1/budget{}", whose.query()),
        None,
    )
    .await
    .map(|_| ())
    .map_err(|f| ctx.failed(f))
}

/// `POST /billing/budget`: the viewer's own budget.
pub(crate) async fn set_own(
    State(state): State<AppState>,
    ctx: Ctx,
    Form(form): Form<BudgetForm>,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    match set(&ctx, &api, Whose::Own, form).await? {
        Ok(()) => Ok(Redirect::to("/billing?done=budget#budget").into_response()),
        Err(refused) => {
            let q = super::billing::BillingQuery::default();
            super::billing::render(&state, &ctx, &q, Some(&refused)).await
        }
    }
}

/// `POST /billing/budget/remove`.
pub(crate) async fn remove_own(
    State(state): State<AppState>,
    ctx: Ctx,
) -> Result<Response, PageError> {
    let api = ctx.api(&state)?;
    remove(&ctx, &api, Whose::Own).await?;
    Ok(Redirect::to("/billing?done=budget-removed#budget").into_response())
}

/// The note a page shows after a budget form did what it asked.
pub(crate) fn done_note(l: Lang, done: &str) -> Option<Markup> {
    let text = match done {
        "budget" => l.t("The budget was set.", "预算已设置。"),
        "budget-removed" => l.t("The budget was removed.", "预算已删除。"),
        _ => return None,
    };
    Some(html! { div.alert.ok role="status" { (text) } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(monthly: &str, alert_at: &str, hours: &str) -> BudgetForm {
        BudgetForm {
            monthly: monthly.into(),
            alert_at: alert_at.into(),
            stop_at_limit: None,
            low_balance_hours: hours.into(),
        }
    }

    #[test]
    fn a_budget_form_becomes_the_apis_body_or_says_which_field_is_wrong() {
        let body = form("500", "50, 80%,100", "12")
            .to_api(Some("lab"))
            .unwrap();
        assert_eq!(body.monthly, Money::units(500));
        assert_eq!(body.alert_at, Some(vec![50, 80, 100]));
        assert_eq!(body.low_balance_hours, Some(12));
        assert_eq!(body.team.as_deref(), Some("lab"));
        assert!(!body.stop_at_limit);
        let defaults = form("10.50", " ", "").to_api(None).unwrap();
        assert_eq!(defaults.alert_at, None);
        assert_eq!(defaults.low_balance_hours, None);
        assert!(form("", "", "")
            .to_api(None)
            .unwrap_err()
            .message
            .starts_with("monthly"));
        assert!(form("lots", "", "")
            .to_api(None)
            .unwrap_err()
            .message
            .starts_with("monthly"));
        assert!(form("5", "half", "")
            .to_api(None)
            .unwrap_err()
            .message
            .starts_with("alert_at"));
        assert!(form("5", "", "-1")
            .to_api(None)
            .unwrap_err()
            .message
            .starts_with("low_balance_hours"));
    }

    #[test]
    fn spent_is_a_whole_percentage_of_the_budget() {
        assert_eq!(percent_of(Money::units(25), Money::units(100)), 25);
        assert_eq!(
            percent_of(Money::from_micros(999_999), Money::units(100)),
            0
        );
        assert_eq!(percent_of(Money::units(150), Money::units(100)), 150);
        assert_eq!(percent_of(Money::units(1), Money::ZERO), 0);
    }
}
