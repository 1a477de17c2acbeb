//! What the web console refuses, seen from a real Chromium and from a plain HTTP client with
//! the same session: an admin page for a tenant or a host is a 403 page, another tenant's
//! instance a 404 page, a form without (or with a wrong) CSRF token is refused and changes
//! nothing while the same form with the page's token works, a login form needs its token,
//! and without a session (never logged in, or logged out) pages lead to the login.

use crate::browser::{self, Browser, Lang};
use crate::console_support::{Console, Http, PASSWORD, SHOWN};

#[test]
fn console_refuses_a_foreign_instance_and_a_form_without_its_token() {
    if !browser::available() {
        return;
    }
    let console = Console::with_gpus(2);
    let ada = console.user("ada", "tenant");
    let bob = console.user("bob", "tenant");
    let adas = console.running(&ada, &["--", "sleep", "600"]);
    let bobs = console.running(&bob, &["--", "sleep", "600"]);
    let browser = Browser::start(Lang::En);

    // Logged out: the instances page leads to the login form (and says where it was going).
    browser.goto(&console.page("/instances"));
    browser.wait_for_path("/login", SHOWN, |p| p == "/login");
    browser.find("input[name=\"username\"]");
    browser.find("input[name=\"password\"]");
    let anonymous = Http::anonymous(&console).get("/instances");
    assert!(
        (300..400).contains(&anonymous.status)
            && anonymous
                .location
                .as_deref()
                .is_some_and(|l| l.starts_with("/login")),
        "logged out, /instances answered {anonymous:?}"
    );

    console.login(&browser, &ada);
    let http = Http::of(&console, &browser);

    // Another tenant's instance: a 404 page that shows nothing of it.
    browser.goto(&console.page(&format!("/instances/{bobs}")));
    let text = browser.page_text();
    assert!(
        text.to_lowercase().contains("not found"),
        "bob's instance, for ada, says: {text:?}"
    );
    assert!(browser.find_all("[data-action=\"stop\"]").is_empty());
    let foreign = http.get(&format!("/instances/{bobs}"));
    assert_eq!(foreign.status, 404, "{foreign:?}");
    assert!(foreign.content_type.starts_with("text/html"), "{foreign:?}");
    assert!(!foreign.body.contains("sleep"), "{foreign:?}");
    // Ada's own stop form: without its CSRF token, or with another, it is refused and the
    // instance runs on; with the page's token it stops it.
    browser.goto(&console.page(&format!("/instances/{adas}")));
    let token = browser
        .attr("input[name=\"_csrf\"]", "value")
        .expect("the page's CSRF token");
    let stop = format!("/instances/{adas}/stop");
    let without = http.post_form(&stop, &[]);
    assert_eq!(without.status, 403, "{without:?}");
    let wrong = http.post_form(&stop, &[("_csrf", "0123456789abcdef0123456789abcdef")]);
    assert_eq!(wrong.status, 403, "{wrong:?}");
    assert_eq!(console.status(&ada.token, &adas), "running");
    let right = http.post_form(&stop, &[("_csrf", &token)]);
    assert!(
        right.status < 400,
        "the stop form with its token: {right:?}"
    );
    console.wait_status(&ada.token, &adas, "stopped");

    // Bob's stop form, with ada's own token: his instance is as unknown to her as its page.
    let stop_bobs = http.post_form(&format!("/instances/{bobs}/stop"), &[("_csrf", &token)]);
    assert_eq!(stop_bobs.status, 404, "{stop_bobs:?}");
    assert_eq!(console.status(&bob.token, &bobs), "running");

    // The login form too needs the token this browser was given with it.
    let anonymous = Http::anonymous(&console);
    let login = anonymous.post_form(
        "/login",
        &[("username", ada.name.as_str()), ("password", PASSWORD)],
    );
    assert_eq!(
        login.status, 403,
        "a login without its CSRF token: {login:?}"
    );
}

#[test]
fn console_admin_page_is_forbidden_to_a_tenant_and_a_host() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let ada = console.user("ada", "tenant");
    let browser = Browser::start(Lang::En);
    console.login(&browser, &ada);
    let http = Http::of(&console, &browser);
    // A 403 page, in HTML, that says so; and the admin's pages below it too.
    browser.goto(&console.page("/admin"));
    let text = browser.page_text();
    assert!(
        text.to_lowercase().contains("forbidden"),
        "the admin page for a tenant says: {text:?}"
    );
    for path in ["/admin", "/admin/users", "/admin/audit"] {
        let page = http.get(path);
        assert_eq!(page.status, 403, "{path} for a tenant: {page:?}");
        assert!(page.content_type.starts_with("text/html"), "{page:?}");
    }
    // Nor may a host.
    console.login(&browser, &console.host);
    let page = Http::of(&console, &browser).get("/admin");
    assert_eq!(page.status, 403, "/admin for a host: {page:?}");
}
