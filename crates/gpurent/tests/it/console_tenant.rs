//! A tenant's day in the web console, in a real Chromium: log in through the form, reserve
//! through the reserve form, watch the instance start and its log grow without reloading,
//! see a stop made with the CLI reach the instances list live, stop through the page's
//! button; then find the charge on the billing page and in the downloaded invoice CSV. The
//! reserve form started from a template (issue 33).

use std::time::Duration;

use crate::browser::{self, Browser, Lang};
use crate::console_support::{cents, stop_from_page, Console, SHOWN};

/// Prints `line-1`, `line-2`, ... one a second for 40 s, then idles.
const TICKER: &str =
    "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo line-$i; sleep 1; done; sleep 600";

/// The highest `line-N` in `log`.
fn last_line(log: &str) -> u32 {
    log.split(|c: char| c.is_whitespace())
        .filter_map(|w| w.strip_prefix("line-"))
        .filter_map(|n| n.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Marks the page: a reload or a navigation loses the mark, a live update keeps it.
fn mark(browser: &Browser) {
    browser.execute("window.__gpurentTestMark = 'still here';", vec![]);
}

fn assert_not_reloaded(browser: &Browser, what: &str) {
    let mark = browser.execute("return window.__gpurentTestMark || null;", vec![]);
    assert_eq!(mark, "still here", "the page was reloaded while {what}");
}

#[test]
fn console_tenant_reserves_watches_its_log_and_stops() {
    if !browser::available() {
        return;
    }
    let console = Console::with_gpus(2);
    let ada = console.user("ada", "tenant");
    let browser = Browser::start(Lang::En);
    console.login(&browser, &ada);

    // The reserve form shows the price before it is sent.
    browser.goto(&console.page("/offers"));
    let form = "form[data-form=\"reserve\"]";
    browser.find(form);
    browser.fill("gpu_type", "RTX4090");
    browser.fill("gpu_count", "1");
    browser.fill("hours", "1");
    browser.fill("command", TICKER);
    let quote = browser.wait_for_text("[data-field=\"quote\"]", ".", SHOWN);
    assert!(
        quote.chars().any(|c| c.is_ascii_digit()),
        "the reserve form shows no price: {quote:?}"
    );
    browser.click(&format!("{form} [type=\"submit\"]"));
    let path = browser.wait_for_path("/instances/ID", SHOWN, |p| {
        p.strip_prefix("/instances/")
            .is_some_and(|id| !id.is_empty())
    });
    let id = path.trim_start_matches("/instances/").to_owned();
    assert_eq!(console.cluster.get(&ada.token, &id)["command"][0], "sh");

    // It starts and its log grows, on the same page.
    mark(&browser);
    browser.wait_for_text(
        "[data-field=\"status\"]",
        "running",
        Duration::from_secs(60),
    );
    let first = browser.wait_for_text("[data-field=\"log\"]", "line-", SHOWN);
    let later = format!("line-{}", last_line(&first) + 2);
    browser.wait_for_text("[data-field=\"log\"]", &later, SHOWN);
    assert_not_reloaded(&browser, "the instance started and its log grew");
    assert_eq!(console.status(&ada.token, &id), "running");
    browser.assert_no_console_errors("the instance page");

    // A reservation stopped with the CLI changes on the instances list, live.
    let other = console.running(&ada, &["--", "sleep", "600"]);
    browser.goto(&console.page("/instances"));
    let row = |r: &str| format!("[data-reservation-id=\"{r}\"] [data-field=\"status\"]");
    browser.wait_for_text(&row(&id), "running", SHOWN);
    browser.wait_for_text(&row(&other), "running", SHOWN);
    mark(&browser);
    let stop = console
        .cluster
        .cli(Some(&ada.token), true, &["stop", &other]);
    assert_eq!(stop.code, 0, "{stop:?}");
    browser.wait_for_text(&row(&other), "stopped", SHOWN);
    assert_not_reloaded(&browser, "a reservation stopped");
    assert_eq!(browser.text(&row(&id)), "running");
    browser.assert_no_console_errors("the instances list");

    // Stopped through the page's button, after its confirmation.
    browser.goto(&console.page(&format!("/instances/{id}")));
    stop_from_page(&browser);
    browser.wait_for_text("[data-field=\"status\"]", "stopped", SHOWN);
    console.wait_status(&ada.token, &id, "stopped");
    browser.assert_no_console_errors("the instance page after its stop");
    console.cluster.ledger_check();
}

#[test]
fn console_reserve_form_starts_from_a_template() {
    if !browser::available() {
        return;
    }
    let console = Console::with_gpus(1);
    let ada = console.user("ada", "tenant");
    let made = console.cluster.cli(
        Some(&ada.token),
        true,
        &[
            "templates",
            "create",
            "greeter",
            "--command",
            "sh -c 'echo from-template $GREETING; sleep 600'",
            "--env",
            "GREETING=hi",
            "--description",
            "says hello",
        ],
    );
    assert_eq!(made.code, 0, "{made:?}");
    let browser = Browser::start(Lang::En);
    console.login(&browser, &ada);

    // The form starts from the template named in the link; the shipped ones are offered too.
    browser.goto(&console.page("/offers?template=greeter"));
    let form = "form[data-form=\"reserve\"]";
    browser.find(form);
    let chosen = browser.execute("return document.getElementById('template').value;", vec![]);
    assert_eq!(chosen, "greeter");
    let offered = browser.text("#template");
    for name in ["shell", "jupyter", "pytorch", "greeter"] {
        assert!(offered.contains(name), "{name} not offered: {offered}");
    }
    browser.fill("gpu_type", "RTX4090");
    browser.fill("gpu_count", "1");
    browser.fill("hours", "1");
    browser.click(&format!("{form} [type=\"submit\"]"));
    let path = browser.wait_for_path("/instances/ID", SHOWN, |p| {
        p.strip_prefix("/instances/")
            .is_some_and(|id| !id.is_empty())
    });
    let id = path.trim_start_matches("/instances/").to_owned();
    // Its command and environment came from the template.
    let r = console.cluster.get(&ada.token, &id);
    assert_eq!(r["command"][0], "sh", "{r}");
    browser.wait_for_text(
        "[data-field=\"log\"]",
        "from-template hi",
        Duration::from_secs(60),
    );
    browser.assert_no_console_errors("the instance page");
    stop_from_page(&browser);
    console.wait_status(&ada.token, &id, "stopped");
}

#[test]
fn console_tenant_finds_the_charge_and_the_invoice() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let ada = console.user("ada", "tenant");
    let id = console.running(&ada, &["--", "sleep", "600"]);
    // At 2.50 an hour, 16 s of use is more than a cent: an amount a page shows.
    std::thread::sleep(Duration::from_secs(16));
    let stop = console.cluster.cli(Some(&ada.token), true, &["stop", &id]);
    assert_eq!(stop.code, 0, "{stop:?}");
    console.wait_status(&ada.token, &id, "stopped");
    let browser = Browser::start(Lang::En);
    console.login(&browser, &ada);
    let charged = console.cluster.get(&ada.token, &id)["charged"]
        .as_str()
        .unwrap()
        .to_owned();
    let cents = cents(&charged);
    assert!(cents >= 1, "16 s at 2.50 an hour charged {charged}");

    // The charge is on the billing page (in cents, cut or rounded) and in the month's
    // invoice, as CSV.
    browser.goto(&console.page("/billing"));
    let shown = [cents, cents + 1].map(|c| format!("{}.{:02}", c / 100, c % 100));
    browser.wait_for_text_where("main", &format!("{shown:?}"), SHOWN, |t| {
        shown.iter().any(|s| t.contains(s.as_str()))
    });
    browser.assert_no_console_errors("the billing page");
    let csv_link = "a[href*=\"csv\"]";
    let href = browser.attr(csv_link, "href").unwrap_or_default();
    browser.click(csv_link);
    let file = browser.wait_for_download(SHOWN);
    let csv = std::fs::read_to_string(&file).unwrap();
    let mut lines = csv.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.split(',').count() > 2,
        "the invoice ({href}, saved as {file:?}) is not CSV: {csv:?}"
    );
    let line = lines
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("no line for {id} in the invoice CSV: {csv:?}"));
    assert!(
        line.contains(&charged),
        "{id} charged {charged}, the invoice says {line:?}"
    );
    browser.assert_no_console_errors("the invoice download");
    console.cluster.ledger_check();
}

#[test]
fn last_line_reads_the_highest_line() {
    assert_eq!(last_line("line-1\nline-2\nline-10\n"), 10);
    assert_eq!(last_line("nothing yet"), 0);
}
