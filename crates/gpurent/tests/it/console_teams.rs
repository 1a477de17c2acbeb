//! Teams, budgets and scoped tokens in the web console, in a real Chromium: an owner makes a
//! team, adds members, moves credit in and sets its budget, sees a member's reservation burn and
//! the month go over; a member and a viewer see the team without its forms, and a viewer's
//! forged form is refused; a token made on the account page shows its scopes and team and does
//! only what they allow; each page in English and in Chinese.

use std::time::Duration;

use serde_json::Value;

use crate::browser::{self, Browser, Lang};
use crate::console_support::{
    check_page, confirm, untranslated_words, Console, Http, User, PASSWORD, SHOWN,
};

/// `gpurent ARGS` as `user`, which must succeed; its JSON.
fn ok(console: &Console, user: &User, args: &[&str]) -> Value {
    let run = console.cluster.cli(Some(&user.token), true, args);
    assert_eq!(run.code, 0, "{args:?}: {run:?}");
    run.json()
}

/// Fills `fields` of the form `data-form=FORM` and sends it.
fn submit(browser: &Browser, form: &str, fields: &[(&str, &str)]) {
    let scope = format!("form[data-form=\"{form}\"]");
    for (name, value) in fields {
        browser.fill_in(&scope, name, value);
    }
    browser.click(&format!("{scope} [type=\"submit\"]"));
}

/// The value of the form control `selector` as the page has it now.
fn value_of(browser: &Browser, selector: &str) -> Value {
    browser.execute(
        "const el = document.querySelector(arguments[0]); \
         return el ? (el.type === 'checkbox' ? el.checked : el.value) : null;",
        vec![Value::from(selector)],
    )
}

/// The role a row of `/teams` or of a team's members says, as the API's word.
fn role_in(browser: &Browser, row: &str) -> Option<String> {
    browser.attr(&format!("{row} [data-field=\"role\"]"), "data-role")
}

#[test]
fn console_teams_owner_runs_a_team_that_members_and_viewers_only_see() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let olga = console.user("olga", "tenant");
    let mia = console.user("mia", "tenant");
    let vic = console.user("vic", "tenant");
    let browser = Browser::start(Lang::En);
    console.login(&browser, &olga);

    // From the navigation to the teams page; a team made there leads to its own page.
    browser.click("header nav a[href=\"/teams\"]");
    browser.wait_for_path("/teams", SHOWN, |p| p == "/teams");
    browser.find("[data-form=\"create-team\"]");
    check_page(&browser, "teams-empty");
    submit(&browser, "create-team", &[("name", "lab")]);
    browser.wait_for_path("/teams/lab", SHOWN, |p| p == "/teams/lab");
    browser.wait_for_text("[data-field=\"your-role\"]", "owner", SHOWN);
    // A second team of that name: refused above the form, the name kept.
    browser.goto(&console.page("/teams"));
    submit(&browser, "create-team", &[("name", "lab")]);
    browser.wait_for_text("[role=\"alert\"]", "lab", SHOWN);
    assert_eq!(value_of(&browser, "#team-name"), "lab");
    browser.console_errors();
    assert_eq!(
        role_in(&browser, "tr[data-team=\"lab\"]").as_deref(),
        Some("owner")
    );

    // Members added from the form; one who does not exist is refused, the form kept.
    browser.goto(&console.page("/teams/lab"));
    submit(&browser, "member", &[("user", "mia"), ("role", "member")]);
    browser.wait_for_text(
        "tr[data-member=\"mia\"] [data-field=\"role\"]",
        "member",
        SHOWN,
    );
    submit(&browser, "member", &[("user", "vic"), ("role", "viewer")]);
    browser.wait_for_text(
        "tr[data-member=\"vic\"] [data-field=\"role\"]",
        "viewer",
        SHOWN,
    );
    submit(&browser, "member", &[("user", "nobody"), ("role", "admin")]);
    browser.wait_for_text("[role=\"alert\"]", "nobody", SHOWN);
    assert_eq!(value_of(&browser, "#member-user"), "nobody");
    assert_eq!(value_of(&browser, "#member-role"), "admin");
    browser.console_errors();
    let lab = ok(&console, &olga, &["teams", "get", "lab"]);
    let members = lab["members"].as_array().cloned().unwrap_or_default();
    assert_eq!(members.len(), 3, "{lab}");

    // Credit moved in: beyond the owner's balance refused saying why (the amount kept), then
    // a move that fits, once.
    submit(&browser, "credit", &[("amount", "80")]);
    let refusal = browser.wait_for_text("[role=\"alert\"]", "credit", SHOWN);
    assert!(refusal.to_lowercase().contains("not enough"), "{refusal}");
    assert_eq!(value_of(&browser, "#credit-amount"), "80");
    browser.console_errors();
    submit(&browser, "credit", &[("amount", "20")]);
    browser.wait_for_text("[data-field=\"team-balance\"]", "20.00", SHOWN);
    let teams = ok(&console, &olga, &["teams", "ls"]);
    assert_eq!(teams[0]["balance"], "20.00", "{teams}");
    assert_eq!(ok(&console, &olga, &["balance"])["balance"], "30.00");

    // The budget: none yet, then set from the form and shown as the API has it.
    browser.find("[data-field=\"no-budget\"]");
    submit(
        &browser,
        "budget",
        &[("monthly", "100"), ("alert_at", "50, 80, 100")],
    );
    browser.wait_for_text("[data-field=\"budget-monthly\"]", "100.00", SHOWN);
    browser.wait_for_text("[data-field=\"budget-spent\"]", "0.00", SHOWN);
    check_page(&browser, "team-owner");

    // A member's reservation for the team: listed on its page, linked to the instance page,
    // and its burn in the forecast.
    let id = console.cluster.reserve(
        &mia.token,
        &[
            "--team", "lab", "--gpu", "RTX-4090", "--hours", "1", "--", "sleep", "600",
        ],
    );
    console.wait_status(&mia.token, &id, "running");
    browser.goto(&console.page("/teams/lab"));
    let budget = ok(&console, &olga, &["budget", "get", "--team", "lab"]);
    let burn = budget["burn_per_hour"].as_str().unwrap().to_owned();
    assert_ne!(burn, "0.00", "{budget}");
    browser.wait_for_text("[data-field=\"budget-burn\"]", &burn, SHOWN);
    let forecast = browser.text("[data-field=\"budget-forecast\"]");
    assert!(
        forecast.chars().any(|c| ('1'..='9').contains(&c)),
        "a running reservation forecasts nothing: {forecast:?}"
    );
    browser.click(&format!(
        "tr[data-reservation-id=\"{id}\"] a[href=\"/instances/{id}\"]"
    ));
    browser.wait_for_path("the instance page", SHOWN, |p| {
        p == format!("/instances/{id}")
    });
    browser.wait_for_text("[data-field=\"status\"]", "running", SHOWN);

    // Spent, then a budget below it: over, said on the page, and new work refused.
    std::thread::sleep(Duration::from_secs(16));
    assert_eq!(
        console
            .cluster
            .cli(Some(&mia.token), true, &["stop", &id])
            .code,
        0
    );
    console.wait_status(&mia.token, &id, "stopped");
    browser.goto(&console.page("/teams/lab"));
    submit(&browser, "budget", &[("monthly", "0.01")]);
    browser.wait_for_text("[data-field=\"budget-over\"]", "Over budget", SHOWN);
    let budget = ok(&console, &olga, &["budget", "get", "--team", "lab"]);
    assert_eq!(budget["over"], true, "{budget}");
    let spent = budget["spent"].as_str().unwrap().to_owned();
    assert_ne!(spent, "0.00", "{budget}");
    browser.wait_for_text("[data-field=\"budget-spent\"]", &spent, SHOWN);
    let refused = console.cluster.cli(
        Some(&mia.token),
        false,
        &[
            "reserve", "--team", "lab", "--gpu", "RTX-4090", "--hours", "1", "--", "sleep", "1",
        ],
    );
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("budget"), "{refused:?}");
    browser.assert_no_console_errors("the team page over its budget");

    // The member sees the team and its budget, with the role member, and none of its forms.
    console.login(&browser, &mia);
    browser.goto(&console.page("/teams"));
    assert_eq!(
        role_in(&browser, "tr[data-team=\"lab\"]").as_deref(),
        Some("member")
    );
    browser.click("tr[data-team=\"lab\"] a");
    browser.wait_for_path("/teams/lab", SHOWN, |p| p == "/teams/lab");
    browser.wait_for_text("[data-field=\"your-role\"]", "member", SHOWN);
    browser.find("[data-field=\"budget-over\"]");
    for form in ["member", "credit", "budget", "budget-remove"] {
        let selector = format!("form[data-form=\"{form}\"]");
        assert!(
            browser.find_all(&selector).is_empty(),
            "a member sees {selector}"
        );
    }
    assert!(browser
        .find_all("[data-action=\"remove-member\"]")
        .is_empty());
    check_page(&browser, "team-member");

    // The viewer neither: and a form forged with the viewer's own session is refused by the
    // API's role table, said on the page, and changes nothing.
    console.login(&browser, &vic);
    browser.goto(&console.page("/teams/lab"));
    browser.wait_for_text("[data-field=\"your-role\"]", "viewer", SHOWN);
    for form in ["member", "credit", "budget"] {
        let selector = format!("form[data-form=\"{form}\"]");
        assert!(
            browser.find_all(&selector).is_empty(),
            "a viewer sees {selector}"
        );
    }
    let csrf = browser
        .attr("input[name=\"_csrf\"]", "value")
        .expect("the page's CSRF token");
    let http = Http::of(&console, &browser);
    let forged = http.post_form(
        "/teams/lab/members",
        &[("_csrf", &csrf), ("user", "vic"), ("role", "owner")],
    );
    assert_eq!(forged.status, 403, "{forged:?}");
    assert!(forged.body.contains("role=\"alert\""), "{}", forged.body);
    assert!(
        forged.body.contains("managing its members needs admin"),
        "{}",
        forged.body
    );
    let budget = http.post_form("/teams/lab/budget", &[("_csrf", &csrf), ("monthly", "500")]);
    assert_eq!(budget.status, 403, "{budget:?}");
    let credit = http.post_form(
        "/teams/lab/credit",
        &[("_csrf", &csrf), ("amount", "1"), ("idempotency_key", "k1")],
    );
    assert_eq!(credit.status, 403, "{credit:?}");
    let lab = ok(&console, &olga, &["teams", "get", "lab"]);
    assert!(
        lab["members"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "vic" && m["role"] == "viewer"),
        "{lab}"
    );
    assert_eq!(
        ok(&console, &olga, &["budget", "get", "--team", "lab"])["monthly"],
        "0.01"
    );

    // The owner removes the viewer from the page.
    console.login(&browser, &olga);
    browser.goto(&console.page("/teams/lab"));
    browser.click("tr[data-member=\"vic\"] [data-action=\"remove-member\"]");
    confirm(&browser);
    browser.wait_for_text("[role=\"status\"]", "removed", SHOWN);
    assert!(browser.find_all("tr[data-member=\"vic\"]").is_empty());
    browser.assert_no_console_errors("the team page after a removal");
    console.cluster.ledger_check();
}

#[test]
fn console_teams_scoped_token_from_the_account_page_does_only_what_it_may() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let olga = console.user("olga", "tenant");
    ok(&console, &olga, &["teams", "create", "lab"]);
    ok(
        &console,
        &olga,
        &["credit", "move", "20", "--to-team", "lab"],
    );
    let browser = Browser::start(Lang::En);
    console.login(&browser, &olga);
    browser.goto(&console.page("/account"));
    let form = "form[data-form=\"token\"]";

    // Refused (a wrong password): said above the form, which keeps all but the password.
    browser.fill_in(form, "name", "ci-lab");
    browser.fill_in(form, "expires_in_days", "7");
    browser.fill_in(form, "team", "lab");
    browser.click(&format!("{form} input[name=\"scope_read\"]"));
    browser.click(&format!("{form} input[name=\"scope_reserve\"]"));
    browser.fill_in(form, "password", "not the password");
    browser.click(&format!("{form} [type=\"submit\"]"));
    browser.wait_for_text("[role=\"alert\"]", "password", SHOWN);
    assert_eq!(value_of(&browser, "#token_name"), "ci-lab");
    assert_eq!(value_of(&browser, "#token_team"), "lab");
    assert_eq!(value_of(&browser, "#expires_in_days"), "7");
    assert_eq!(value_of(&browser, "input[name=\"scope_reserve\"]"), true);
    assert_eq!(value_of(&browser, "input[name=\"scope_billing\"]"), false);
    assert_eq!(value_of(&browser, "#token_password"), "");
    browser.console_errors();

    // With the password: shown once, listed with its scopes and team.
    browser.fill_in(form, "password", PASSWORD);
    browser.click(&format!("{form} [type=\"submit\"]"));
    let lab_token = browser.text("[data-field=\"new-token\"] [data-field=\"token\"]");
    assert!(lab_token.starts_with("gpr_"), "{lab_token}");
    let listed = ok(&console, &olga, &["tokens", "ls"]);
    let id = listed
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == "ci-lab")
        .and_then(|t| t["id"].as_str())
        .unwrap_or_else(|| panic!("no token ci-lab in {listed}"))
        .to_owned();
    let row = format!("tr[data-token-id=\"{id}\"]");
    assert_eq!(
        browser.text(&format!("{row} [data-field=\"scopes\"]")),
        "read,reserve"
    );
    assert_eq!(browser.text(&format!("{row} [data-field=\"team\"]")), "lab");
    browser.assert_no_console_errors("the account page with a new token");

    // It reserves for the team (without --team), and reaches nothing of olga's own account.
    let id = console.cluster.reserve(
        &lab_token,
        &["--gpu", "RTX-4090", "--hours", "1", "--", "sleep", "600"],
    );
    assert_eq!(console.cluster.get(&lab_token, &id)["team"], "lab");
    let balance = console.cluster.cli(Some(&lab_token), false, &["balance"]);
    assert_ne!(balance.code, 0, "{balance:?}");
    assert!(balance.stderr.contains("bound to a team"), "{balance:?}");
    assert_eq!(
        console
            .cluster
            .cli(Some(&lab_token), true, &["stop", &id])
            .code,
        0
    );
    console.wait_status(&lab_token, &id, "stopped");

    // One that may only read billing, for olga's own account: the balance, not a reservation.
    browser.goto(&console.page("/account"));
    browser.fill_in(form, "name", "books");
    browser.fill_in(form, "expires_in_days", "1");
    browser.click(&format!("{form} input[name=\"scope_billing\"]"));
    browser.fill_in(form, "password", PASSWORD);
    browser.click(&format!("{form} [type=\"submit\"]"));
    let books = browser.text("[data-field=\"new-token\"] [data-field=\"token\"]");
    let listed = ok(&console, &olga, &["tokens", "ls"]);
    let books_id = listed
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == "books")
        .and_then(|t| t["id"].as_str())
        .unwrap_or_default()
        .to_owned();
    let row = format!("tr[data-token-id=\"{books_id}\"]");
    assert_eq!(
        browser.text(&format!("{row} [data-field=\"scopes\"]")),
        "billing"
    );
    assert_eq!(browser.text(&format!("{row} [data-field=\"team\"]")), "—");
    let balance = console.cluster.cli(Some(&books), true, &["balance"]);
    assert_eq!(balance.code, 0, "{balance:?}");
    assert_eq!(balance.json()["balance"], "30.00");
    let reserve = console.cluster.cli(
        Some(&books),
        false,
        &[
            "reserve", "--gpu", "RTX-4090", "--hours", "1", "--", "sleep", "1",
        ],
    );
    assert_ne!(reserve.code, 0, "{reserve:?}");
    assert!(
        reserve.stderr.contains("do not include reserve"),
        "{reserve:?}"
    );
    browser.assert_no_console_errors("the account page with two scoped tokens");
}

#[test]
fn console_teams_pages_and_budgets_in_english_and_chinese() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let olga = console.user("olga", "tenant");
    let mia = console.user("mia", "tenant");
    ok(&console, &olga, &["teams", "create", "lab"]);
    ok(
        &console,
        &olga,
        &["teams", "add", "lab", "mia", "--role", "member"],
    );
    ok(
        &console,
        &olga,
        &["credit", "move", "10", "--to-team", "lab"],
    );
    ok(
        &console,
        &olga,
        &["budget", "set", "--team", "lab", "--monthly", "100"],
    );
    ok(
        &console,
        &olga,
        &[
            "tokens",
            "create",
            "--name",
            "ci",
            "--team",
            "lab",
            "--scope",
            "read",
            "--expires",
            "7d",
        ],
    );

    // Olga's own budget, from the billing page: a bad amount is refused with the form kept,
    // then set, shown, and removed.
    let browser = Browser::start(Lang::En);
    console.login(&browser, &olga);
    browser.goto(&console.page("/billing"));
    browser.find("[data-field=\"no-budget\"]");
    submit(&browser, "budget", &[("monthly", "lots")]);
    browser.wait_for_text("[role=\"alert\"]", "monthly", SHOWN);
    assert_eq!(value_of(&browser, "#budget-monthly-in"), "lots");
    browser.console_errors();
    submit(
        &browser,
        "budget",
        &[
            ("monthly", "250"),
            ("alert_at", "80"),
            ("low_balance_hours", "6"),
        ],
    );
    browser.wait_for_text("[data-field=\"budget-monthly\"]", "250.00", SHOWN);
    browser.find("[data-field=\"budget-forecast\"]");
    browser.find("[data-field=\"budget-spent\"]");
    let mine = ok(&console, &olga, &["budget", "get"]);
    assert_eq!(mine["alert_at"], serde_json::json!([80]), "{mine}");
    assert_eq!(mine["low_balance_hours"], 6, "{mine}");
    assert_eq!(value_of(&browser, "#budget-monthly-in"), "250.00");
    browser.click("[data-action=\"remove-budget\"]");
    confirm(&browser);
    browser.wait_for_text("[role=\"status\"]", "removed", SHOWN);
    browser.find("[data-field=\"no-budget\"]");
    let gone = console
        .cluster
        .cli(Some(&olga.token), true, &["budget", "get"]);
    assert_ne!(gone.code, 0, "{gone:?}");
    ok(&console, &olga, &["budget", "set", "--monthly", "40"]);
    drop(browser);

    // Each page, for the owner and the member, in each language.
    let data = ["olga", "mia", "lab", "ci"];
    for lang in [Lang::En, Lang::ZhCn] {
        let browser = Browser::start(lang);
        for user in [&olga, &mia] {
            console.login(&browser, user);
            for path in ["/teams", "/teams/lab", "/billing", "/account"] {
                let url = match lang {
                    Lang::En => console.page(path),
                    Lang::ZhCn => console.page(&format!("{path}?lang=zh-CN")),
                };
                browser.goto(&url);
                browser.find("main h1");
                let name = format!(
                    "teams.{}.{}",
                    user.name,
                    path.trim_matches('/').replace('/', "-")
                );
                check_page(&browser, &name);
                let unlabelled = browser.unlabelled_fields();
                assert!(
                    unlabelled.is_empty(),
                    "{name}: fields without a label: {unlabelled:?}"
                );
                let shown = browser.hidden_but_shown();
                assert!(shown.is_empty(), "{name}: hidden, yet shown: {shown:?}");
                if lang == Lang::ZhCn {
                    let english = untranslated_words(&browser, &data);
                    assert!(
                        english.is_empty(),
                        "{name}: English in the Chinese page: {english:?}"
                    );
                }
            }
        }
        // The team's page in this language says the role and the budget in it.
        browser.goto(&console.page("/teams/lab"));
        let said = browser.text("[data-field=\"your-role\"]");
        let expected = match lang {
            Lang::En => "member",
            Lang::ZhCn => "成员",
        };
        assert_eq!(said, expected);
        let budget_h = browser.text("#budget-h");
        let expected = match lang {
            Lang::En => "Monthly budget",
            Lang::ZhCn => "月度预算",
        };
        assert_eq!(budget_h, expected);
    }
}
