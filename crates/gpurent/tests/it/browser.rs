//! A real headless Chromium driven over WebDriver (Debian's `chromium` and `chromedriver`),
//! for the web console's tests: pages, forms, clicks, text, screenshots and the browser console.

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

mod layout;
mod tiny_site;

pub use tiny_site::TinySite;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The desktop and phone viewports every screenshot is taken at.
pub const DESKTOP: (u32, u32) = (1280, 900);
pub const PHONE: (u32, u32) = (390, 844);

/// How long `click`, `fill` and friends wait for their element to appear.
const FIND: Duration = Duration::from_secs(15);

/// The language the browser asks for (`--lang` and `Accept-Language`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    En,
    ZhCn,
}

impl Lang {
    pub fn tag(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::ZhCn => "zh-CN",
        }
    }

    fn accept_languages(self) -> &'static str {
        match self {
            Lang::En => "en-US,en",
            Lang::ZhCn => "zh-CN,zh",
        }
    }
}

/// Whether this run has a browser: GPURENT_TEST_BROWSER=0 skips the browser tests; =1 (what
/// scripts/test.sh exports once it has installed Chromium) makes a missing one a failure;
/// unset, a machine without one skips them with a message.
pub fn available() -> bool {
    let wanted = std::env::var("GPURENT_TEST_BROWSER").ok();
    if wanted.as_deref() == Some("0") {
        eprintln!("SKIPPED: GPURENT_TEST_BROWSER=0");
        return false;
    }
    let present = Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if !present {
        if wanted.as_deref() == Some("1") {
            panic!("GPURENT_TEST_BROWSER=1 but {CHROMIUM} or {CHROMEDRIVER} is missing");
        }
        eprintln!("SKIPPED: no {CHROMIUM} and {CHROMEDRIVER} (scripts/test.sh installs them)");
    }
    present
}

/// The workspace's target directory: the one the `gpurent` binary under test was built into.
pub fn target_dir() -> PathBuf {
    let bin = Path::new(crate::support::BIN);
    // target/<profile>/gpurent (or target/<triple>/<profile>/gpurent: its screenshots then sit
    // beside that profile, still under target/).
    bin.parent()
        .and_then(Path::parent)
        .expect("the gpurent binary sits in target/<profile>/")
        .to_owned()
}

/// Where `screenshot` writes: `target/console-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    target_dir().join("console-screenshots")
}

/// `chromedriver` in its own process group (Chromium runs in it too): the whole group is
/// killed with SIGKILL when dropped, so no browser outlives its test, even one that panicked.
struct Driver {
    child: Child,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// One headless Chromium session. Its methods block (the tests are synchronous); a failed
/// WebDriver call panics with what was asked.
pub struct Browser {
    // Field order is drop order: the session first, then the driver (and Chromium), then the
    // profile directory.
    client: Option<Client>,
    rt: tokio::runtime::Runtime,
    lang: Lang,
    _driver: Driver,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // Ends the session politely; the driver's process group is killed next anyway.
            let _ = self.rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), client.close()).await
            });
        }
    }
}

/// A WebDriver command on the session that fantoccini does not wrap (the browser log,
/// Chrome DevTools commands): `POST /session/ID/PATH` with a JSON body.
#[derive(Debug)]
struct SessionPost {
    path: &'static str,
    body: Value,
}

impl WebDriverCompatibleCommand for SessionPost {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        let session = session_id.unwrap_or_default();
        base_url.join(&format!("session/{session}/{}", self.path))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.to_string()))
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium asking for `lang`,
    /// its window at the desktop size.
    pub fn start(lang: Lang) -> Browser {
        let profile = tempfile::tempdir().expect("a profile directory");
        let port = free_port();
        let log = std::fs::File::create(profile.path().join("chromedriver.log")).expect("log");
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER}: {e}"));
        let mut driver = Driver { child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = driver.child.try_wait() {
                let log = std::fs::read_to_string(profile.path().join("chromedriver.log"));
                panic!(
                    "chromedriver exited with {status}: {}",
                    log.unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on port {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }

        let user_data = profile.path().join("chromium");
        let downloads = profile.path().join("downloads");
        std::fs::create_dir_all(&downloads).expect("the downloads directory");
        let mut caps = Capabilities::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    // The tests run as root, where Chromium's sandbox cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-extensions",
                    // Nothing outside loopback is reachable, and nothing should be tried.
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    format!("--window-size={},{}", DESKTOP.0, DESKTOP.1),
                    format!("--lang={}", lang.tag()),
                    format!("--user-data-dir={}", user_data.display()),
                ],
                "prefs": {
                    "intl.accept_languages": lang.accept_languages(),
                    "download.default_directory": downloads.to_str().expect("a UTF-8 path"),
                    "download.prompt_for_download": false,
                },
            }),
        );
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let webdriver = format!("http://127.0.0.1:{port}");
        let client = rt.block_on(async {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            tokio::time::timeout(
                Duration::from_secs(60),
                ClientBuilder::new(connector)
                    .capabilities(caps)
                    .connect(&webdriver),
            )
            .await
        });
        let client = match client {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                let log = std::fs::read_to_string(profile.path().join("chromedriver.log"));
                panic!("no Chromium session: {e}\n{}", log.unwrap_or_default())
            }
            Err(_) => panic!("no Chromium session within 60 s"),
        };
        let browser = Browser {
            client: Some(client),
            rt,
            lang,
            _driver: driver,
            _profile: profile,
        };
        // Every page records the CSP violations it hears of (`csp_violations`).
        browser.cdp(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({ "source": RECORD_VIOLATIONS }),
        );
        browser
    }

    pub fn lang(&self) -> Lang {
        self.lang
    }

    /// Where the browser saves what it downloads.
    pub fn downloads_dir(&self) -> PathBuf {
        self._profile.path().join("downloads")
    }

    /// Waits for a finished download (Chromium writes `NAME.crdownload` until it is whole);
    /// its path.
    pub fn wait_for_download(&self, deadline: Duration) -> PathBuf {
        let dir = self.downloads_dir();
        let end = Instant::now() + deadline;
        // Chromium puts an empty file under the final name while it writes the
        // `.crdownload`, then renames that over it: done when no `.crdownload` is left and the
        // file's size holds between two looks.
        let mut last: Option<(PathBuf, u64)> = None;
        let mut same = 0;
        loop {
            let paths: Vec<PathBuf> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            let writing = paths
                .iter()
                .any(|p| p.extension().is_some_and(|x| x == "crdownload"));
            let done = paths
                .iter()
                .find(|p| p.extension().is_none_or(|x| x != "crdownload"))
                .map(|p| (p.clone(), std::fs::metadata(p).map_or(0, |m| m.len())));
            if !writing && done.is_some() && done == last {
                same += 1;
                // An empty file is only taken for a download once it has stayed so for 2 s.
                if let Some((path, len)) = &done {
                    if *len > 0 || same >= 10 {
                        return path.clone();
                    }
                }
            } else {
                same = 0;
            }
            last = done;
            assert!(
                Instant::now() < end,
                "nothing downloaded into {dir:?} within {deadline:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Chromium's profile directory (named on the command line of each of its processes).
    pub fn profile_dir(&self) -> PathBuf {
        self._profile.path().join("chromium")
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("a live session")
    }

    fn block<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// Opens `url` and waits for it to load.
    pub fn goto(&self, url: &str) {
        self.block(self.client().goto(url))
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    }

    pub fn current_url(&self) -> url::Url {
        self.block(self.client().current_url())
            .expect("the current URL")
    }

    /// The path of the current URL (`/instances/ID`).
    pub fn path(&self) -> String {
        self.current_url().path().to_owned()
    }

    /// Waits until the current path satisfies `check`; its path.
    pub fn wait_for_path(
        &self,
        what: &str,
        deadline: Duration,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let end = Instant::now() + deadline;
        loop {
            let path = self.path();
            if check(&path) {
                return path;
            }
            assert!(
                Instant::now() < end,
                "the page did not reach {what} within {deadline:?}; it is at {}",
                self.current_url()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The first element matching the CSS `selector`, waited for.
    pub fn find(&self, selector: &str) -> fantoccini::elements::Element {
        self.block(
            self.client()
                .wait()
                .at_most(FIND)
                .for_element(Locator::Css(selector)),
        )
        .unwrap_or_else(|e| {
            panic!(
                "no element {selector:?} on {} within {FIND:?}: {e}",
                self.current_url()
            )
        })
    }

    /// Every element matching `selector` now (none is no error).
    pub fn find_all(&self, selector: &str) -> Vec<fantoccini::elements::Element> {
        self.block(self.client().find_all(Locator::Css(selector)))
            .unwrap_or_else(|e| panic!("cannot look for {selector:?}: {e}"))
    }

    /// Sets the form control named `name` (an input, textarea or select) to `value`.
    pub fn fill(&self, name: &str, value: &str) {
        self.fill_in("", name, value);
    }

    /// `fill` for the control named `name` inside the element matching `scope` (one form of
    /// many on a page).
    pub fn fill_in(&self, scope: &str, name: &str, value: &str) {
        let selector = format!("{scope} [name=\"{name}\"]");
        let selector = selector.trim_start();
        let element = self.find(selector);
        let tag = self.block(element.tag_name()).expect("a tag name");
        if tag.eq_ignore_ascii_case("select") {
            if let Err(e) = self.block(element.select_by_value(value)) {
                let options = self.execute(
                    "return Array.from(arguments[0].options, o => o.value);",
                    vec![serde_json::to_value(&element).expect("an element reference")],
                );
                panic!("no option {value:?} in select {name:?} (it has {options}): {e}");
            }
        } else {
            self.block(element.clear())
                .unwrap_or_else(|e| panic!("cannot clear {name:?}: {e}"));
            self.block(element.send_keys(value))
                .unwrap_or_else(|e| panic!("cannot type into {name:?}: {e}"));
        }
    }

    /// Clicks the first element matching `selector`.
    pub fn click(&self, selector: &str) {
        let element = self.find(selector);
        self.block(element.click())
            .unwrap_or_else(|e| panic!("cannot click {selector:?}: {e}"));
    }

    /// Types `keys` into the element matching `selector` (WebDriver key codes allowed, e.g.
    /// `fantoccini::key::Key::Enter`).
    pub fn type_into(&self, selector: &str, keys: &str) {
        let element = self.find(selector);
        self.block(element.send_keys(keys))
            .unwrap_or_else(|e| panic!("cannot type into {selector:?}: {e}"));
    }

    /// The rendered text of the first element matching `selector`.
    pub fn text(&self, selector: &str) -> String {
        let element = self.find(selector);
        self.block(element.text())
            .unwrap_or_else(|e| panic!("no text of {selector:?}: {e}"))
    }

    /// The value of attribute `name` of the first element matching `selector`.
    pub fn attr(&self, selector: &str, name: &str) -> Option<String> {
        let element = self.find(selector);
        self.block(element.attr(name))
            .unwrap_or_else(|e| panic!("no attribute {name} of {selector:?}: {e}"))
    }

    /// The whole page's rendered text (`document.body.innerText`).
    pub fn page_text(&self) -> String {
        self.execute(
            "return document.body ? document.body.innerText : '';",
            vec![],
        )
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    /// Runs `script` in the page (a function body; `arguments` are `args`).
    pub fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.block(self.client().execute(script, args))
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls until an element matching `selector` contains `text` in its rendered text, for at
    /// most `deadline`; that element's text. Panics with what the elements said instead.
    pub fn wait_for_text(&self, selector: &str, text: &str, deadline: Duration) -> String {
        self.wait_for_text_where(selector, &format!("{text:?}"), deadline, |t| {
            t.contains(text)
        })
    }

    /// Polls until an element matching `selector` has a rendered text that satisfies `check`
    /// (described as `what`), for at most `deadline`; that text.
    pub fn wait_for_text_where(
        &self,
        selector: &str,
        what: &str,
        deadline: Duration,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let end = Instant::now() + deadline;
        let mut seen = Vec::new();
        loop {
            seen.clear();
            // An element replaced while it is read (a live update) is read again next time.
            if let Ok(elements) = self.block(self.client().find_all(Locator::Css(selector))) {
                for element in elements {
                    if let Ok(t) = self.block(element.text()) {
                        if check(&t) {
                            return t;
                        }
                        seen.push(t);
                    }
                }
            }
            if Instant::now() >= end {
                panic!(
                    "no {selector:?} with {what} on {} within {deadline:?}; saw {seen:?}",
                    self.current_url()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Accepts a `confirm()` or `alert()` dialog, if one opens within `deadline`; whether one did.
    pub fn accept_dialog(&self, deadline: Duration) -> bool {
        let end = Instant::now() + deadline;
        loop {
            if self.block(self.client().accept_alert()).is_ok() {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The value of the cookie `name` the browser holds for the current page.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.block(self.client().get_named_cookie(name))
            .ok()
            .map(|c| c.value().to_owned())
    }

    fn session_post(&self, path: &'static str, body: Value) -> Value {
        self.block(self.client().issue_cmd(SessionPost { path, body }))
            .unwrap_or_else(|e| panic!("WebDriver {path} failed: {e}"))
    }

    /// A Chrome DevTools Protocol command, through chromedriver.
    pub fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.session_post("goog/cdp/execute", json!({"cmd": cmd, "params": params}))
    }

    /// Every SEVERE entry of Chromium's console since the last call (console.error, uncaught
    /// exceptions, CSP violations, failed loads), as `SOURCE: MESSAGE` lines.
    pub fn console_errors(&self) -> Vec<String> {
        let entries = self.session_post("se/log", json!({"type": "browser"}));
        entries
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| {
                format!(
                    "{}: {}",
                    e["source"].as_str().unwrap_or("?"),
                    e["message"].as_str().unwrap_or("?")
                )
            })
            .collect()
    }

    /// The CSP violations the page has heard of since it was loaded, as `DIRECTIVE BLOCKED
    /// SAMPLE` lines (an inline style or script refused, say).
    pub fn csp_violations(&self) -> Vec<String> {
        let seen = self.execute("return window.__cspViolations || [];", vec![]);
        seen.as_array()
            .into_iter()
            .flatten()
            .map(|v| v.as_str().unwrap_or("?").to_owned())
            .collect()
    }

    /// Panics listing the console's SEVERE entries and the page's CSP violations, if any,
    /// saying on which page.
    pub fn assert_no_console_errors(&self, page: &str) {
        let mut errors = self.console_errors();
        errors.extend(
            self.csp_violations()
                .into_iter()
                .map(|v| format!("CSP violation: {v}")),
        );
        assert!(
            errors.is_empty(),
            "Chromium's console has errors on {page} ({}):\n{}",
            self.current_url(),
            errors.join("\n")
        );
    }
}

/// Records each `securitypolicyviolation` a page hears of in `window.__cspViolations`; run
/// in every new document before its own scripts.
const RECORD_VIOLATIONS: &str = "window.__cspViolations = [];\
document.addEventListener('securitypolicyviolation', function (e) {\
  window.__cspViolations.push(e.effectiveDirective + ' ' + e.blockedURI + ' ' + e.sample);\
});";
