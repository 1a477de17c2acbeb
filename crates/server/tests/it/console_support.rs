//! A console user without a browser: a session cookie from the real login form, pages fetched
//! and forms posted as a browser would (no redirects followed), and the checks every page
//! gets: its security headers, and no English left on a zh-CN page.

use reqwest::header::{HeaderMap, CONTENT_SECURITY_POLICY, COOKIE, LOCATION, SET_COOKIE};
use reqwest::StatusCode;
use serde_json::json;

use crate::app::{Tenant, TestApp};

pub const PASSWORD: &str = "correct horse battery";

/// One logged-in browser session of the console.
#[derive(Debug, Clone)]
pub struct Console {
    http: reqwest::Client,
    pub base: String,
    pub cookie: String,
    pub csrf: String,
}

/// A page as it came back.
#[derive(Debug)]
pub struct Page {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub html: String,
}

impl Page {
    pub fn location(&self) -> Option<&str> {
        self.headers.get(LOCATION).and_then(|v| v.to_str().ok())
    }
}

pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The value of `name="NAME" value="..."` in a page (the first).
pub fn field_value(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\" value=\""))?;
    let rest = &html[at + name.len() + 15..];
    Some(rest[..rest.find('"')?].to_owned())
}

fn cookie_of(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| {
            let first = c.split(';').next()?;
            let (k, v) = first.split_once('=')?;
            (k == name && !v.is_empty()).then(|| v.to_owned())
        })
}

/// Sets the user's password through the API (the same again, with the current one, when it
/// has one), then logs in through the form.
pub async fn login(app: &TestApp, user: &Tenant, name: &str) -> Console {
    let (status, body) = user
        .client
        .post(
            "/api/v1/users/me/password",
            &json!({"password": PASSWORD, "current_password": PASSWORD}),
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    login_with(&app.base, name, PASSWORD)
        .await
        .expect("logged in")
}

/// The admin, logged in.
pub async fn login_admin(app: &TestApp) -> Console {
    let admin = app.admin();
    let (status, users) = admin.get("/api/v1/users").await;
    assert_eq!(status, StatusCode::OK, "{users}");
    let me = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["role"] == "admin")
        .expect("the first-start admin")
        .clone();
    let tenant = Tenant {
        id: me["id"].as_str().unwrap().to_owned(),
        client: admin.clone(),
    };
    login(app, &tenant, me["name"].as_str().unwrap()).await
}

/// The login form, as a browser fills it: its cookie and CSRF field, then the POST. `Err`:
/// the page that answered instead of a session.
pub async fn login_with(base: &str, name: &str, password: &str) -> Result<Console, Page> {
    let http = no_redirects();
    let form = http.get(format!("{base}/login")).send().await.unwrap();
    assert_eq!(form.status(), StatusCode::OK);
    let login_cookie = cookie_of(form.headers(), "gpurent_login").expect("a login cookie");
    let html = form.text().await.unwrap();
    let csrf = field_value(&html, "_csrf").expect("a _csrf field");
    let answer = http
        .post(format!("{base}/login"))
        .header(COOKIE, format!("gpurent_login={login_cookie}"))
        .form(&[
            ("username", name),
            ("password", password),
            ("_csrf", &csrf),
            ("next", "/"),
        ])
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let headers = answer.headers().clone();
    let Some(session) = cookie_of(&headers, "gpurent_session") else {
        let html = answer.text().await.unwrap();
        return Err(Page {
            status,
            headers,
            html,
        });
    };
    assert_eq!(status, StatusCode::SEE_OTHER);
    let mut console = Console {
        http,
        base: base.to_owned(),
        cookie: session,
        csrf: String::new(),
    };
    let page = console.get("/offers").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    console.csrf = field_value(&page.html, "_csrf").expect("pages carry the CSRF token");
    Ok(console)
}

impl Console {
    pub async fn get(&self, path: &str) -> Page {
        self.get_with(path, &[]).await
    }

    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Page {
        let mut r = self
            .http
            .get(format!("{}{path}", self.base))
            .header(COOKIE, format!("gpurent_session={}", self.cookie));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        page(r.send().await.unwrap()).await
    }

    /// A form as the page posts it, with this session's CSRF token.
    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        let mut all = fields.to_vec();
        all.push(("_csrf", &self.csrf));
        self.post_raw(path, &all, &[]).await
    }

    /// A form exactly as given (no CSRF token unless in `fields`), with extra headers.
    pub async fn post_raw(
        &self,
        path: &str,
        fields: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Page {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header(COOKIE, format!("gpurent_session={}", self.cookie))
            .form(fields);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        page(r.send().await.unwrap()).await
    }
}

async fn page(response: reqwest::Response) -> Page {
    let status = response.status();
    let headers = response.headers().clone();
    let html = response.text().await.unwrap();
    Page {
        status,
        headers,
        html,
    }
}

/// Every console page: a CSP without inline scripts or styles that forbids frames, and no
/// caching.
pub fn assert_secure_headers(page: &Page) {
    let csp = page
        .headers
        .get(CONTENT_SECURITY_POLICY)
        .expect("a CSP")
        .to_str()
        .unwrap();
    assert!(csp.contains("script-src 'self';"), "{csp}");
    assert!(!csp.contains("'unsafe-inline'"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.headers["cache-control"], "no-store");
}

/// Words a zh-CN page may show in Latin letters: names, units and protocol words.
pub const ALLOWED_LATIN: &[&str] = &[
    "gpurent",
    "GPU",
    "GPUs",
    "CPU",
    "SSH",
    "API",
    "CSV",
    "USD",
    "GB",
    "GiB",
    "MiB",
    "KEY",
    "VALUE",
    "RTX",
    "RTX4090",
    "H100",
    "H200",
    "A100",
    "A100-80GB",
    "Docker",
    "HTTP",
    "sh",
    "English",
    "UTC",
    "ID",
    "JSON",
    "URL",
    "Jupyter",
    "VRAM",
    "PCIe",
    "NVML",
    "TLS",
];

/// The words of a page's visible text (outside `<code>`, `<pre>`, scripts and styles) that
/// are Latin words of three letters or more and not allowed: untranslated English.
pub fn untranslated(html: &str) -> Vec<String> {
    let mut text = String::new();
    let mut rest = html;
    let skipped = ["code", "pre", "script", "style"];
    while let Some(lt) = rest.find('<') {
        text.push_str(&rest[..lt]);
        text.push(' ');
        let tag_end = rest[lt..].find('>').map_or(rest.len(), |e| lt + e + 1);
        let tag = &rest[lt + 1..tag_end.saturating_sub(1)];
        let name = tag
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or("");
        rest = &rest[tag_end..];
        // Raw data, and what the page marks as not to be translated (names).
        if skipped.contains(&name) || tag.contains("translate=\"no\"") {
            let close = format!("</{name}>");
            rest = rest.find(&close).map_or("", |c| &rest[c + close.len()..]);
        }
    }
    text.push_str(rest);
    let text = text
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"");
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.chars().filter(char::is_ascii_alphabetic).count() >= 3)
        // Ids, versions and model names have digits.
        .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
        .filter(|w| !ALLOWED_LATIN.contains(w))
        .filter(|w| {
            !gpurent_types::ReservationStatus::ALL
                .iter()
                .any(|s| s.as_str() == *w)
        })
        .map(str::to_owned)
        .collect()
}

// For the billing, account and nodes page tests.
impl Page {
    /// The page has this markup, or the test fails showing the page.
    #[track_caller]
    pub fn assert_has(&self, text: &str) {
        assert!(
            self.html.contains(text),
            "the page ({}) does not contain {text:?}:\n{}",
            self.status,
            self.html
        );
    }

    /// A header's value, empty when absent.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// A zh-CN page, shown, with no English left in its visible text.
#[track_caller]
pub fn assert_translated(page: &Page) {
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    assert!(page.html.contains("<html lang=\"zh-CN\">"), "{}", page.html);
    let english = untranslated(&page.html);
    assert!(
        english.is_empty(),
        "untranslated {english:?}:\n{}",
        page.html
    );
}
