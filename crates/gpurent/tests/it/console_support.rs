//! What the web console's browser tests share: a control plane with one node (the process
//! executor) owned by a host, users with console passwords, logging in through the form, and
//! the checks every page gets (no console errors, screenshots, the page's language).

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::browser::Browser;
use crate::support::{eventually, Cluster, Daemon, BIN};

/// Every user's console password in these tests.
pub const PASSWORD: &str = "correct horse battery staple";

/// How long a page has to show what it is waited for (pages update themselves in about a
/// second; a loaded 2-core machine is slower).
pub const SHOWN: Duration = Duration::from_secs(20);

/// A user of the console: its id, API token and name.
pub struct User {
    pub id: String,
    pub token: String,
    pub name: String,
}

/// A control plane with SSH (the relay the web terminal shares) and one node, `node-1`, with
/// simulated RTX 4090s and the process executor, joined by the host `hana`.
pub struct Console {
    pub cluster: Cluster,
    pub url: String,
    pub host: User,
    _agent: Daemon,
}

impl Console {
    /// With one GPU.
    pub fn start() -> Console {
        Console::with_gpus(1)
    }

    pub fn with_gpus(gpus: u32) -> Console {
        Console::with(gpus, "process")
    }

    /// With `gpus` GPUs and the executor `executor` (`process` or `docker`).
    pub fn with(gpus: u32, executor: &str) -> Console {
        let cluster = Cluster::start_with(
            "127.0.0.1:0",
            &["--ssh-listen", "127.0.0.1:0", "--min-disk-free-gb", "0"],
        );
        let host = user(&cluster, "hana", "host");
        let join = cluster.cli(Some(&host.token), true, &["nodes", "join-token"]);
        assert_eq!(join.code, 0, "a host makes a join token: {join:?}");
        let join = join.json();
        let data = cluster.dir.path().join("node-1");
        let sim = format!("{gpus}xRTX4090");
        let mut args: Vec<String> = [
            "--server",
            cluster.url.as_str(),
            "agent",
            "--data-dir",
            data.to_str().unwrap(),
            "--name",
            "node-1",
            "--sim-gpus",
            sim.as_str(),
            "--executor",
            executor,
            // Limits that fit a 2-core machine.
            "--cpus-per-gpu",
            "1",
            "--memory-per-gpu-gb",
            "1",
            "--join-token",
            join["token"].as_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec();
        if executor == "process" {
            // Not in the machine's cgroup tree and unisolated: these tests are about the
            // console, not limits or isolation.
            args.extend(
                [
                    "--cgroup-root",
                    "/nonexistent/gpurent",
                    "--allow-unisolated",
                ]
                .map(str::to_owned),
            );
        }
        let agent = cluster.agent("node-1", &args);
        cluster.wait_ready(1);
        Console {
            url: cluster.url.clone(),
            cluster,
            host,
            _agent: agent,
        }
    }

    /// A user with 50 of credit and the console password.
    pub fn user(&self, name: &str, role: &str) -> User {
        user(&self.cluster, name, role)
    }

    /// The first-start admin, with the console password set from the CLI.
    pub fn admin(&self) -> User {
        let token = self.cluster.admin.clone();
        set_password(&self.cluster.url, &token, None);
        let users = self
            .cluster
            .cli(Some(&token), true, &["users", "ls"])
            .json();
        let admin = users
            .as_array()
            .into_iter()
            .flatten()
            .find(|u| u["role"] == "admin")
            .cloned()
            .unwrap_or_else(|| panic!("no admin in {users}"));
        User {
            id: admin["id"].as_str().unwrap().to_owned(),
            name: admin["name"].as_str().unwrap().to_owned(),
            token,
        }
    }

    /// The page at `path` (`/offers`).
    pub fn page(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// Logs `user` in through the login form (logging out whoever was); the browser is then on
    /// its start page.
    pub fn login(&self, browser: &Browser, user: &User) {
        browser.goto(&self.page("/login"));
        if browser.path() != "/login" {
            // Someone is logged in already (the login page leads on): log out first.
            browser.click("form[action=\"/logout\"] [type=\"submit\"]");
            browser.wait_for_path("/login", SHOWN, |p| p == "/login");
        }
        browser.fill("username", &user.name);
        browser.fill("password", PASSWORD);
        browser.click("form[action=\"/login\"] [type=\"submit\"], form [type=\"submit\"]");
        browser.wait_for_path("a page past /login", SHOWN, |p| p != "/login");
        assert!(
            browser.cookie("gpurent_session").is_some(),
            "no session cookie after logging in as {}",
            user.name
        );
    }

    /// A reservation's status as the API says.
    pub fn status(&self, token: &str, id: &str) -> String {
        self.cluster.get(token, id)["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub fn wait_status(&self, token: &str, id: &str, status: &str) {
        eventually(&format!("{id} {status}"), 60, || {
            self.status(token, id) == status
        });
    }

    /// A running reservation of `user` made with `gpurent reserve --gpu RTX-4090 --hours 1
    /// ARGS` (more flags, then `-- COMMAND`).
    pub fn running(&self, user: &User, args: &[&str]) -> String {
        let args = [&["--gpu", "RTX-4090", "--hours", "1"][..], args].concat();
        let id = self.cluster.reserve(&user.token, &args);
        self.wait_status(&user.token, &id, "running");
        id
    }
}

fn user(cluster: &Cluster, name: &str, role: &str) -> User {
    let args = ["users", "create", name, "--role", role, "--credit", "50"];
    let created = cluster.cli(Some(&cluster.admin), true, &args);
    assert_eq!(created.code, 0, "{created:?}");
    let created = created.json();
    let id = created["id"].as_str().unwrap().to_owned();
    set_password(&cluster.url, &cluster.admin, Some(&id));
    User {
        id,
        token: created["token"].as_str().unwrap().to_owned(),
        name: name.to_owned(),
    }
}

/// `gpurent users passwd [ID]` with the password in GPURENT_PASSWORD.
fn set_password(url: &str, token: &str, id: Option<&str>) {
    let out = Command::new(BIN)
        .args(["--server", url, "--token", token, "users", "passwd"])
        .args(id)
        .env("GPURENT_PASSWORD", PASSWORD)
        // Setting one's own again needs the current one.
        .envs(
            id.is_none()
                .then_some(("GPURENT_CURRENT_PASSWORD", PASSWORD)),
        )
        .env("GPURENT_DATA_DIR", "/nonexistent")
        .env_remove("GPURENT_TOKEN")
        .output()
        .expect("run gpurent users passwd");
    assert!(
        out.status.success(),
        "users passwd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What every page gets: its `<html lang>` is the browser's language, Chromium's console has
/// no error, it fits a phone's width, and a screenshot at desktop and phone width.
pub fn check_page(browser: &Browser, name: &str) {
    let lang = browser.execute("return document.documentElement.lang;", vec![]);
    assert_eq!(
        lang,
        Value::from(browser.lang().tag()),
        "<html lang> of {name} ({})",
        browser.current_url()
    );
    browser.screenshot(name);
    browser.assert_fits_phone(name);
    browser.assert_no_console_errors(name);
}

/// Words that stay as they are in a Chinese page: names of things (products, GPU models, the
/// language switch's "English"), units, protocol and format names, the API's status words
/// (the contract's `data-field="status"` text), the product's name.
const UNTRANSLATED: &[&str] = &[
    "gpurent",
    "gpu",
    "gpus",
    "cpu",
    "cpus",
    "ssh",
    "api",
    "csv",
    "json",
    "http",
    "https",
    "url",
    "tls",
    "csrf",
    "utc",
    "gib",
    "mib",
    "kib",
    "tib",
    "nvidia",
    "geforce",
    "rtx",
    "tesla",
    "usd",
    "eur",
    "cny",
    "pending",
    "starting",
    "running",
    "stopping",
    "stopped",
    "failed",
    "preempted",
    "lost",
    "expired",
    "ready",
    "unhealthy",
    "draining",
    "drained",
    "cordoned",
    "queued",
    "xterm",
    "docker",
    "english",
];

/// The English words in the visible text of a page in Chinese: ASCII words of 3 letters or
/// more that are not in `UNTRANSLATED` nor in `data` (names the test made: users, nodes).
/// Program text is not prose: `<code>`, `<pre>`, `<kbd>`, `<samp>`, `translate="no"`, form
/// values, the log and the terminal are left out; `title`, `aria-label` and `alt` are in.
pub fn untranslated_words(browser: &Browser, data: &[&str]) -> Vec<String> {
    let texts = browser.execute(
        r#"
        const skip = 'code, pre, kbd, samp, script, style, textarea, noscript, [translate="no"], '
            + '[data-field="log"], [data-field="terminal"], .xterm';
        const out = [];
        const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
        for (let n = walk.nextNode(); n; n = walk.nextNode()) {
            const el = n.parentElement;
            if (!el || el.closest(skip)) continue;
            // Only what is shown.
            if (!el.checkVisibility || el.checkVisibility()) out.push(n.textContent);
        }
        for (const el of document.querySelectorAll('[title], [aria-label], img[alt]')) {
            if (el.closest(skip)) continue;
            for (const a of ['title', 'aria-label', 'alt']) {
                if (el.hasAttribute(a)) out.push(el.getAttribute(a));
            }
        }
        out.push(document.title);
        return out;
        "#,
        vec![],
    );
    let mut found = Vec::new();
    for text in texts.as_array().into_iter().flatten() {
        found.extend(english_words(text.as_str().unwrap_or_default(), data));
    }
    found.sort();
    found.dedup();
    found
}

/// The words of `text` that `untranslated_words` flags.
pub fn english_words(text: &str, data: &[&str]) -> Vec<String> {
    let token_char = |c: char| c.is_ascii_alphanumeric() || "-_./:@".contains(c);
    let mut found = Vec::new();
    for token in text.split(|c: char| !token_char(c)) {
        // Ids, models, amounts and paths are not prose: anything with a digit or a slash.
        if token.chars().any(|c| c.is_ascii_digit()) || token.contains('/') {
            continue;
        }
        for word in token.split(|c: char| !c.is_ascii_alphabetic()) {
            if word.len() < 3 {
                continue;
            }
            let lower = word.to_ascii_lowercase();
            let allowed = UNTRANSLATED.contains(&lower.as_str())
                || data.iter().any(|d| d.eq_ignore_ascii_case(word));
            if !allowed {
                found.push(word.to_owned());
            }
        }
    }
    found
}

#[test]
fn english_words_are_found_and_names_are_not() {
    assert_eq!(
        english_words("状态：running，GPU：RTX-4090 ×1，每小时 0.50 USD", &[]),
        Vec::<String>::new()
    );
    assert_eq!(
        english_words("节点 node-1 的 Earnings（hana）", &["hana", "node"]),
        ["Earnings"]
    );
    assert_eq!(
        english_words("id 3fbe2a1c-0c7e-4b8a-9f0e-2c55aa01bd3e, 12.5 GiB", &[]),
        Vec::<String>::new()
    );
    assert_eq!(english_words("Log in 登录", &[]), ["Log"]);
}

/// An amount of money as the API writes it (`62.34`, `50`, `0.0125`) in hundredths, cut
/// (never a float).
pub fn cents(amount: &str) -> i64 {
    let (whole, fraction) = amount.split_once('.').unwrap_or((amount, ""));
    let fraction: String = fraction.chars().chain("00".chars()).take(2).collect();
    let whole: i64 = whole
        .parse()
        .unwrap_or_else(|_| panic!("not an amount: {amount:?}"));
    let fraction: i64 = fraction
        .parse()
        .unwrap_or_else(|_| panic!("not an amount: {amount:?}"));
    whole * 100 + fraction
}

#[test]
fn cents_reads_the_apis_amounts() {
    assert_eq!(cents("50"), 5000);
    assert_eq!(cents("62.34"), 6234);
    assert_eq!(cents("0.0125"), 1);
    assert_eq!(cents("7.5"), 750);
}

/// Clicks the instance page's stop control and confirms.
pub fn stop_from_page(browser: &Browser) {
    browser.click("[data-action=\"stop\"]");
    confirm(browser);
}

/// Confirms what was just asked for, if the page asks: a `confirm()` dialog, or the submit
/// button of an open `<dialog>`.
pub fn confirm(browser: &Browser) {
    if browser.accept_dialog(Duration::from_secs(2)) {
        return;
    }
    if !browser
        .find_all("dialog[open] [type=\"submit\"]")
        .is_empty()
    {
        browser.click("dialog[open] [type=\"submit\"]");
    }
}

/// What a plain HTTP client (no browser) is answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub location: Option<String>,
    pub content_type: String,
    pub body: String,
}

/// A plain HTTP client carrying a console session's cookie (taken from the browser): for what
/// a browser will not do, like posting a form without its CSRF token.
pub struct Http {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
    cookie: Option<String>,
}

impl Http {
    /// With the browser's session cookie (none when it is logged out).
    pub fn of(console: &Console, browser: &Browser) -> Http {
        let cookie = browser
            .cookie("gpurent_session")
            .map(|v| format!("gpurent_session={v}"));
        Http::with_cookie(console, cookie)
    }

    /// Without a session.
    pub fn anonymous(console: &Console) -> Http {
        Http::with_cookie(console, None)
    }

    /// Logged in as `user` through the login form, as a second browser would be.
    pub fn login(console: &Console, user: &User) -> Http {
        let anonymous = Http::anonymous(console);
        let (login_cookie, html) = anonymous.rt.block_on(async {
            let form = anonymous
                .client
                .get(format!("{}/login", console.url))
                .send()
                .await
                .expect("the login form");
            let cookie = set_cookie_value(form.headers(), "gpurent_login");
            (cookie, form.text().await.unwrap_or_default())
        });
        let login_cookie = login_cookie.expect("the login form sets its cookie");
        let csrf = html
            .split("name=\"_csrf\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the login form's _csrf field")
            .to_owned();
        let session = anonymous.rt.block_on(async {
            let answer = anonymous
                .client
                .post(format!("{}/login", console.url))
                .header(
                    reqwest::header::COOKIE,
                    format!("gpurent_login={login_cookie}"),
                )
                .header(reqwest::header::ORIGIN, &console.url)
                .form(&[
                    ("username", user.name.as_str()),
                    ("password", PASSWORD),
                    ("_csrf", csrf.as_str()),
                ])
                .send()
                .await
                .expect("the login answer");
            set_cookie_value(answer.headers(), "gpurent_session")
        });
        let session = session.unwrap_or_else(|| panic!("{} could not log in", user.name));
        Http::with_cookie(console, Some(format!("gpurent_session={session}")))
    }

    fn with_cookie(console: &Console, cookie: Option<String>) -> Http {
        Http {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            base: console.url.clone(),
            cookie,
        }
    }

    fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let request = match &self.cookie {
            Some(c) => request.header(reqwest::header::COOKIE, c),
            None => request,
        };
        self.rt.block_on(async {
            let response = request.send().await.expect("an answer");
            let header = |name| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let location = header(reqwest::header::LOCATION);
            let content_type = header(reqwest::header::CONTENT_TYPE).unwrap_or_default();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            Answer {
                status,
                location,
                content_type,
                body,
            }
        })
    }

    pub fn get(&self, path: &str) -> Answer {
        self.send(self.client.get(format!("{}{path}", self.base)))
    }

    /// Posts `fields` as a form, from this site (`Origin` is the console's, as a browser sends).
    pub fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> Answer {
        let request = self
            .client
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::ORIGIN, &self.base)
            .form(fields);
        self.send(request)
    }
}

/// The value a response's `Set-Cookie` gives the cookie `name`.
fn set_cookie_value(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
        .filter(|v| !v.is_empty())
}
