//! The browser harness itself, against a tiny page server on loopback: a click and a form
//! fill change the page, screenshots are PNGs of the right widths, `console.error` and a CSP
//! violation are reported, the language reaches `Accept-Language`, and no Chromium process
//! outlives its `Browser`, even one dropped by a panic.

use std::path::Path;
use std::time::Duration;

use crate::browser::{self, Browser, Lang, TinySite};

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript";

fn site() -> TinySite {
    TinySite::start(vec![
        (
            "/",
            HTML,
            "",
            "<!doctype html><html lang=\"en\"><head><title>harness</title>\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <script src=\"/app.js\" defer></script></head><body>\
             <p id=\"count\">0</p><button id=\"bump\" type=\"button\">bump</button>\
             <form action=\"/done\" method=\"get\"><label>Who <input name=\"who\"></label>\
             <select name=\"tier\"><option value=\"spot\">spot</option>\
             <option value=\"on-demand\">on-demand</option></select>\
             <button id=\"go\" type=\"submit\">go</button></form>\
             <a id=\"csv\" href=\"/file.csv\">csv</a></body></html>",
        ),
        (
            "/app.js",
            JS,
            "",
            "document.getElementById('bump').addEventListener('click', () => {\
             const c = document.getElementById('count');\
             c.textContent = String(Number(c.textContent) + 1); });",
        ),
        (
            "/done",
            HTML,
            "",
            "<!doctype html><html><head><script src=\"/done.js\" defer></script>\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"></head>\
             <body>hello <span id=\"who\"></span></body></html>",
        ),
        (
            "/done.js",
            JS,
            "",
            "const p = new URLSearchParams(location.search);\
             document.getElementById('who').textContent = p.get('who') + '/' + p.get('tier');",
        ),
        (
            "/error",
            HTML,
            "",
            "<!doctype html><html><head><script src=\"/error.js\"></script></head>\
             <body>error page</body></html>",
        ),
        ("/error.js", JS, "", "console.error('boom-from-page');"),
        (
            "/csp",
            HTML,
            "Content-Security-Policy: script-src 'self'\r\n",
            "<!doctype html><html><head><title>csp</title></head><body>csp page\
             <script>document.title = 'inline ran';</script></body></html>",
        ),
        (
            "/file.csv",
            "text/csv",
            "Content-Disposition: attachment; filename=\"file.csv\"\r\n",
            "a,b\n1,2\n",
        ),
        (
            "/wide",
            HTML,
            "",
            "<!doctype html><html><head>\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"></head>\
             <body><div style=\"overflow-x: auto\"><table style=\"min-width: 900px\"><tr>\
             <td style=\"width: 850px\">wide</td>\
             <td><span class=\"sr\" style=\"position: absolute\">for screen readers</span>\
             </td></tr></table></div>\
             <button hidden style=\"display: inline-block\">shown anyway</button>\
             <p hidden>truly hidden</p></body></html>",
        ),
        ("/favicon.ico", "image/x-icon", "", ""),
    ])
}

/// Processes whose command line names `dir` (Chromium's profile directory).
fn processes_naming(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&needle) {
                found.push(format!(
                    "{}: {cmdline}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
    }
    found
}

fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{path:?} is not a PNG"
    );
    let image = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png).unwrap();
    (image.width(), image.height())
}

#[test]
fn browser_harness_drives_a_real_chromium() {
    if !browser::available() {
        return;
    }
    let site = site();
    let browser = Browser::start(Lang::En);
    let profile = browser.profile_dir();
    assert!(
        !processes_naming(&profile).is_empty(),
        "no Chromium process names its profile {profile:?}"
    );

    // A click runs the page's script.
    browser.goto(&format!("{}/", site.url));
    // The label check: the input is in its label, the select has none.
    assert_eq!(browser.unlabelled_fields(), vec!["select[tier]".to_owned()]);
    browser.click("#bump");
    browser.click("#bump");
    assert_eq!(
        browser.wait_for_text("#count", "2", Duration::from_secs(10)),
        "2"
    );

    // A download lands in the downloads directory.
    browser.click("#csv");
    let csv = browser.wait_for_download(Duration::from_secs(10));
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), "a,b\n1,2\n");

    // A form fill (a text input and a select) and its submission.
    browser.fill("who", "ada");
    browser.fill("tier", "on-demand");
    browser.click("#go");
    browser.wait_for_path("/done", Duration::from_secs(10), |p| p == "/done");
    browser.wait_for_text("#who", "ada/on-demand", Duration::from_secs(10));
    assert!(browser.page_text().contains("hello ada/on-demand"));
    assert_eq!(browser.console_errors(), Vec::<String>::new());

    // Screenshots: PNGs at desktop and phone widths, under target/.
    let [desktop, phone] = browser.screenshot("harness-selftest");
    assert!(desktop.starts_with(browser::target_dir()), "{desktop:?}");
    assert_eq!(png_size(&desktop).0, browser::DESKTOP.0);
    assert_eq!(png_size(&phone).0, browser::PHONE.0);
    assert_eq!(png_size(&phone).1, browser::PHONE.1);
    browser.assert_fits_phone("the harness page");
    // A page without a viewport for phones is caught.
    browser.goto(&format!("{}/error", site.url));
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        browser.assert_fits_phone("a page without a viewport")
    }));
    assert!(caught.is_err());
    // A positioned element escaping its scrolling box widens the page; it is named.
    browser.goto(&format!("{}/wide", site.url));
    let why = browser.phone_misfit().expect("the wide page does not fit");
    assert!(why.contains("span.sr"), "{why}");
    assert!(
        !why.contains("table"),
        "the table scrolls in its box: {why}"
    );
    // The viewport is the desktop's again.
    assert_eq!(browser.inner_width(), u64::from(browser::DESKTOP.0));

    // console.error is reported, and only once (the log is drained).
    browser.goto(&format!("{}/error", site.url));
    let errors = browser.console_errors();
    assert!(
        errors.iter().any(|e| e.contains("boom-from-page")),
        "console.error not reported: {errors:?}"
    );
    assert_eq!(browser.console_errors(), Vec::<String>::new());

    // A CSP violation (an inline script under script-src 'self') is reported, and the script
    // did not run.
    browser.goto(&format!("{}/csp", site.url));
    let errors = browser.console_errors();
    assert!(
        errors.iter().any(|e| e.contains("Content Security Policy")),
        "CSP violation not reported: {errors:?}"
    );
    assert_eq!(browser.execute("return document.title;", vec![]), "csp");

    // English asked for English.
    let languages = site.languages();
    assert!(!languages.is_empty());
    assert!(
        languages.iter().all(|l| l.starts_with("en")),
        "{languages:?}"
    );

    drop(browser);
    let left = processes_naming(&profile);
    assert!(left.is_empty(), "Chromium outlived its Browser: {left:?}");
}

#[test]
fn browser_harness_asks_for_chinese_and_dies_with_a_panic() {
    if !browser::available() {
        return;
    }
    let site = site();
    let profile = std::sync::Mutex::new(None);
    let outcome = std::panic::catch_unwind(|| {
        let browser = Browser::start(Lang::ZhCn);
        *profile.lock().unwrap() = Some(browser.profile_dir());
        browser.goto(&format!("{}/", site.url));
        assert_eq!(
            browser.execute("return navigator.language;", vec![]),
            "zh-CN"
        );
        panic!("a test failing with its browser open");
    });
    assert!(outcome.is_err());
    let languages = site.languages();
    assert!(
        languages.first().is_some_and(|l| l.starts_with("zh-CN")),
        "Accept-Language: {languages:?}"
    );
    let profile = profile
        .lock()
        .unwrap()
        .clone()
        .expect("the browser started");
    let left = processes_naming(&profile);
    assert!(left.is_empty(), "Chromium outlived a panic: {left:?}");
}
