//! Every page of the web console, for each role, in English and in Chinese, in a real
//! Chromium: found by following the console's own links from each role's start page. Each
//! page says its language in `<html lang>`, leaves Chromium's console without an error, fits a
//! phone's width, shows nothing it marks `hidden`, is saved as a screenshot at desktop and
//! phone width under `target/console-screenshots/`, and in Chinese shows no untranslated
//! English.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::browser::{self, Browser, Lang};
use crate::console_support::{untranslated_words, Console, User, SHOWN};

/// Enough for every page a role has; a console with more is cut here, and says so.
const MOST_PAGES: usize = 40;

/// `/instances/3fbe...` as `instances-ID`: screenshot names that do not change per run.
fn slug(path: &str) -> String {
    let named: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(|part| {
            let uuid = part.len() >= 32 && part.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
            if uuid {
                "ID".to_owned()
            } else {
                part.replace(['?', '=', '&'], "_")
            }
        })
        .collect();
    let name = named.join("-");
    if name.is_empty() {
        "home".to_owned()
    } else {
        name
    }
}

/// Whether a link leads to another console page to walk (not an action, a download, a
/// fragment of a page, an asset, the API or a published port).
fn walkable(href: &str) -> bool {
    let path = href.split('#').next().unwrap_or_default();
    path.starts_with('/')
        && !path.starts_with("//")
        && !["/logout", "/assets/", "/api/", "/proxy/", "/login"]
            .iter()
            .any(|p| path.starts_with(p))
        && !path.contains("lang=")
        && !path.contains("csv")
        && !path.ends_with("/log")
}

/// Walks the console from `start` as the browser is (logged in or not), following the
/// pages' links when `follow`; what is wrong with each page.
fn walk(
    console: &Console,
    browser: &Browser,
    role: &str,
    start: &[&str],
    data: &[&str],
    follow: bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut queue: Vec<String> = start.iter().map(|s| (*s).to_owned()).collect();
    let mut seen = BTreeSet::new();
    let mut names = BTreeSet::new();
    // Errors of the login and of the page before.
    browser.console_errors();
    while let Some(path) = queue.first().cloned() {
        queue.remove(0);
        if !seen.insert(path.clone()) {
            continue;
        }
        if seen.len() > MOST_PAGES {
            problems.push(format!(
                "more than {MOST_PAGES} pages: {path} and on not walked"
            ));
            break;
        }
        browser.goto(&console.page(&path));
        let here = browser.path();
        // Two pages of one kind (two instances) get two screenshots.
        let mut name = format!("{role}.{}", slug(&path));
        let mut n = 1;
        while !names.insert(name.clone()) {
            n += 1;
            name = format!("{role}.{}-{n}", slug(&path));
        }
        if here == "/login" && path != "/login" {
            problems.push(format!("{path}: leads to the login page"));
            continue;
        }
        let lang = browser.execute("return document.documentElement.lang;", vec![]);
        if lang != browser.lang().tag() {
            problems.push(format!(
                "{path}: <html lang={lang}>, not {}",
                browser.lang().tag()
            ));
        }
        browser.screenshot(&name);
        let shown = browser.hidden_but_shown();
        if !shown.is_empty() {
            problems.push(format!("{path}: hidden, yet shown: {shown:?}"));
        }
        if let Some(why) = browser.phone_misfit() {
            problems.push(format!("{path}: {why}"));
        }
        let unlabelled = browser.unlabelled_fields();
        if !unlabelled.is_empty() {
            problems.push(format!("{path}: fields without a label: {unlabelled:?}"));
        }
        if browser.lang() == Lang::ZhCn {
            let english = untranslated_words(browser, data);
            if !english.is_empty() {
                problems.push(format!("{path}: English in the Chinese page: {english:?}"));
            }
        }
        // Live parts refresh themselves about once a second: give them one refresh to fail in.
        std::thread::sleep(Duration::from_millis(1200));
        for error in browser.console_errors() {
            problems.push(format!("{path}: console: {error}"));
        }
        if !follow {
            continue;
        }
        let links = browser.execute(
            "return Array.from(document.querySelectorAll('a[href]'), a => a.getAttribute('href'));",
            vec![],
        );
        for href in links
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h.as_str())
        {
            let href = href.split('#').next().unwrap_or_default().to_owned();
            if walkable(&href) && !seen.contains(&href) && !queue.contains(&href) {
                queue.push(href);
            }
        }
    }
    eprintln!("{role} in {}: walked {seen:?}", browser.lang().tag());
    problems
}

/// A console with something on every page: a running and a stopped reservation of the
/// tenant `ada` (their log, terminal and charges), the host's node.
struct Scene {
    console: Console,
    ada: User,
    running: String,
}

impl Scene {
    fn new() -> Scene {
        let console = Console::with_gpus(2);
        let ada = console.user("ada", "tenant");
        let stopped = console.running(&ada, &["--", "sh", "-c", "echo warming up; sleep 600"]);
        let stop = console
            .cluster
            .cli(Some(&ada.token), true, &["stop", &stopped]);
        assert_eq!(stop.code, 0, "{stop:?}");
        let running = console.running(&ada, &["--", "sh", "-c", "echo ready; sleep 600"]);
        Scene {
            console,
            ada,
            running,
        }
    }

    /// The names this scene made, which stay as they are in any language.
    fn data(&self, admin: &str) -> Vec<String> {
        [
            "ada", "hana", admin, "node", "sleep", "echo", "warming", "ready",
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

fn every_page_of(role: &str, lang: Lang) {
    let scene = Scene::new();
    let console = &scene.console;
    let browser = Browser::start(lang);
    let admin = console.admin();
    let data = scene.data(&admin.name);
    let data: Vec<&str> = data.iter().map(String::as_str).collect();

    // The login page, before anyone is logged in.
    let mut problems = walk(
        console,
        &browser,
        &format!("{role}-anonymous"),
        &["/login"],
        &data,
        false,
    );
    let user = match role {
        "tenant" => &scene.ada,
        "host" => &console.host,
        _ => &admin,
    };
    console.login(&browser, user);
    let instance = format!("/instances/{}", scene.running);
    let start: Vec<&str> = match role {
        "tenant" => vec![
            "/",
            "/offers",
            "/instances",
            &instance,
            "/billing",
            "/account",
        ],
        "host" => vec!["/", "/nodes", "/account"],
        _ => vec!["/", "/admin", "/nodes", "/account"],
    };
    problems.extend(walk(console, &browser, role, &start, &data, true));
    assert!(
        problems.is_empty(),
        "{} problems on the {role}'s pages in {}:\n{}",
        problems.len(),
        lang.tag(),
        problems.join("\n")
    );
}

#[test]
fn console_every_tenant_page_in_english() {
    if browser::available() {
        every_page_of("tenant", Lang::En);
    }
}

#[test]
fn console_every_tenant_page_in_chinese() {
    if browser::available() {
        every_page_of("tenant", Lang::ZhCn);
    }
}

#[test]
fn console_every_host_page_in_english() {
    if browser::available() {
        every_page_of("host", Lang::En);
    }
}

#[test]
fn console_every_host_page_in_chinese() {
    if browser::available() {
        every_page_of("host", Lang::ZhCn);
    }
}

#[test]
fn console_every_admin_page_in_english() {
    if browser::available() {
        every_page_of("admin", Lang::En);
    }
}

#[test]
fn console_every_admin_page_in_chinese() {
    if browser::available() {
        every_page_of("admin", Lang::ZhCn);
    }
}

/// `?lang=` switches the language over `Accept-Language`, and the choice is remembered.
#[test]
fn console_language_switch_is_remembered() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let browser = Browser::start(Lang::En);
    let lang = || browser.execute("return document.documentElement.lang;", vec![]);
    browser.goto(&console.page("/login"));
    assert_eq!(lang(), "en");
    browser.goto(&console.page("/login?lang=zh-CN"));
    assert_eq!(lang(), "zh-CN");
    browser.wait_for_text("body", "登录", SHOWN);
    browser.goto(&console.page("/login"));
    assert_eq!(lang(), "zh-CN", "the choice of Chinese was not remembered");
    browser.goto(&console.page("/login?lang=en"));
    assert_eq!(lang(), "en");
    browser.goto(&console.page("/login"));
    assert_eq!(lang(), "en");
}

#[test]
fn slugs_and_walkable_links() {
    assert_eq!(slug("/"), "home");
    assert_eq!(
        slug("/instances/3fbe2a1c-0c7e-4b8a-9f0e-2c55aa01bd3e"),
        "instances-ID"
    );
    assert_eq!(slug("/admin/users"), "admin-users");
    assert!(walkable("/admin/audit"));
    assert!(!walkable("/logout"));
    assert!(!walkable("/billing/invoice.csv"));
    assert!(!walkable("https://example.org/"));
    assert!(!walkable("/instances/x/log"));
}
