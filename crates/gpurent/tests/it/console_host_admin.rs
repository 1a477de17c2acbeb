//! A host and an admin in the web console, in a real Chromium: the host drains its node from
//! the nodes page; the admin grants a tenant credit from the admin pages, finds the grant in
//! the audit trail and verifies the trail there.

use crate::browser::{self, Browser, Lang};
use crate::console_support::{cents, confirm, Console, SHOWN};

#[test]
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
    let form = format!("tr[data-user-id=\"{}\"] form[data-form=\"credit\"]", ada.id);
    browser.fill_in(&form, "amount", "12.34");
    browser.click(&format!("{form} [type=\"submit\"]"));
    confirm(&browser);
    let row = format!("tr[data-user-id=\"{}\"] [data-field=\"balance\"]", ada.id);
    browser.wait_for_text(&row, "62.34", SHOWN);
    assert_eq!(balance(), 6234);
    browser.assert_no_console_errors("the users page after a credit");

    // The grant is in the audit trail, found with the page's search: by the admin, answered
    // 200.
    browser.goto(&console.page("/admin"));
    browser.click("a[href^=\"/admin/audit\"]");
    let grant = format!("/api/v1/users/{}/credit", ada.id);
    let search = "form[data-form=\"audit-search\"]";
    browser.fill_in(search, "resource", &grant);
    browser.click(&format!("{search} [type=\"submit\"]"));
    let record = browser.wait_for_text("table[data-table=\"audit\"] tr[data-seq]", &grant, SHOWN);
    assert!(record.contains(&admin.id), "the grant's record: {record:?}");
    assert!(record.contains("200"), "the grant's record: {record:?}");
    browser.assert_no_console_errors("the audit search");

    // Verified from the page: intact, over as many records as the CLI then finds (or fewer:
    // requests go on being recorded).
    browser.click("[data-action=\"verify\"]");
    browser.find("[data-field=\"verdict\"]");
    assert_eq!(
        browser
            .attr("[data-field=\"verdict\"]", "data-ok")
            .as_deref(),
        Some("true"),
        "the console's verdict on a sound trail: {}",
        browser.text("[data-field=\"verdict\"]")
    );
    let on_page: u64 = browser
        .text("[data-field=\"records\"]")
        .trim()
        .parse()
        .unwrap();
    let cli = console
        .cluster
        .cli(Some(&admin.token), true, &["audit", "verify"]);
    assert_eq!(cli.code, 0, "the CLI verifies the trail: {cli:?}");
    let by_cli = cli.json()["records"].as_u64().unwrap();
    assert!(
        on_page > 0 && on_page <= by_cli,
        "the page verified {on_page} records, the CLI then {by_cli}"
    );
    browser.assert_no_console_errors("the audit verification");
}
