//! A host and an admin in the web console, in a real Chromium: the host drains its node from
//! the nodes page; the admin grants a tenant credit from the admin pages, finds the grant in
//! the audit trail and verifies the trail there.

use crate::browser::{self, Browser, Lang};
use crate::console_support::{cents, confirm, Console, SHOWN};

#[test]
#[ignore = "needs the nodes page"]
fn console_host_drains_its_node() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let browser = Browser::start(Lang::En);
    console.login(&browser, &console.host);
    browser.goto(&console.page("/nodes"));
    browser.wait_for_text("body", "node-1", SHOWN);
    browser.click("[data-action=\"drain\"]");
    confirm(&browser);
    browser.wait_for_text("body", "draining", SHOWN);
    crate::support::eventually("node-1 draining", 30, || {
        console.cluster.node_status("node-1").as_deref() == Some("draining")
    });
    browser.assert_no_console_errors("the nodes page after a drain");
}

#[test]
#[ignore = "needs the admin pages (users, audit)"]
fn console_admin_grants_credit_and_verifies_the_audit_trail() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let ada = console.user("ada", "tenant");
    let admin = console.admin();
    let balance = || {
        let b = console
            .cluster
            .cli(Some(&ada.token), true, &["balance"])
            .json();
        cents(b["balance"].as_str().unwrap_or_default())
    };
    assert_eq!(balance(), 5000);
    let browser = Browser::start(Lang::En);
    console.login(&browser, &admin);

    // The users page, from the admin page's own links.
    browser.goto(&console.page("/admin"));
    browser.click("a[href^=\"/admin/users\"]");
    let form = format!("form[data-form=\"credit\"][data-user-id=\"{}\"]", ada.id);
    browser.find(&form);
    browser.execute(
        "const f = document.querySelector(arguments[0]); \
         f.querySelector('[name=\"amount\"]').value = '12.34';",
        vec![form.clone().into()],
    );
    browser.click(&format!("{form} [type=\"submit\"]"));
    confirm(&browser);
    crate::support::eventually("the credit", 30, || balance() == 6234);
    browser.assert_no_console_errors("the users page after a credit");

    // The grant is in the audit trail, and the trail verifies.
    browser.goto(&console.page("/admin"));
    browser.click("a[href^=\"/admin/audit\"]");
    let grant = format!("/api/v1/users/{}/credit", ada.id);
    browser.wait_for_text("body", &grant, SHOWN);
    browser.click("[data-action=\"verify\"]");
    let verdict = browser.wait_for_text_where("[data-field=\"verify\"]", "a verdict", SHOWN, |t| {
        !t.trim().is_empty()
    });
    let cli = console
        .cluster
        .cli(Some(&admin.token), true, &["audit", "verify"]);
    assert_eq!(cli.code, 0, "the CLI verifies the trail: {cli:?}");
    assert!(
        verdict.to_lowercase().contains("ok") || verdict.to_lowercase().contains("verified"),
        "the console's verdict on a sound trail: {verdict:?}"
    );
    browser.assert_no_console_errors("the audit page");
}
