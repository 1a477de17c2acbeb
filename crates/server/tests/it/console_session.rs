//! A logged-in console user for the page tests, without a browser: a real login through the
//! login form (its cookie and CSRF token), then pages fetched and forms posted with the session
//! cookie and the page's CSRF token, redirects not followed; and the check that a page in
//! Chinese left no English words in its visible text.

use reqwest::header::{HeaderMap, COOKIE, SET_COOKIE};
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;

pub const PASSWORD: &str = "a long console password";

/// One answer of the console.
pub struct Page {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Page {
    /// Where a redirect leads.
    pub fn location(&self) -> &str {
        self.headers
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    #[track_caller]
    pub fn assert_has(&self, text: &str) {
        assert!(
            self.body.contains(text),
            "the page ({}) does not contain {text:?}:\n{}",
            self.status,
            self.body
        );
    }
}

pub struct ConsoleUser {
    http: reqwest::Client,
    base: String,
    cookie: String,
    pub csrf: String,
}

/// A cookie's value from an answer's `Set-Cookie` headers.
fn set_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| {
            let (k, rest) = v.split_once('=')?;
            (k == name).then(|| rest.split(';').next().unwrap_or("").to_owned())
        })
}

/// The value of the first hidden `_csrf` field of a page.
pub fn csrf_field(html: &str) -> String {
    let marker = "name=\"_csrf\" value=\"";
    let start = html.find(marker).expect("a _csrf field") + marker.len();
    html[start..]
        .split('"')
        .next()
        .expect("the field's value")
        .to_owned()
}

impl ConsoleUser {
    /// Sets the user's password (as an admin) and logs in through the login form.
    pub async fn login(app: &TestApp, user_id: &str, name: &str) -> ConsoleUser {
        let (status, body) = app
            .admin()
            .post(
                &format!("/api/v1/users/{user_id}/password"),
                &json!({ "password": PASSWORD }),
            )
            .await;
        assert!(status.is_success(), "{status} {body}");
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let form = http
            .get(format!("{}/login", app.base))
            .send()
            .await
            .unwrap();
        let login_cookie = set_cookie(form.headers(), "gpurent_login").expect("a login cookie");
        let html = form.text().await.unwrap();
        let answer = http
            .post(format!("{}/login", app.base))
            .header(COOKIE, format!("gpurent_login={login_cookie}"))
            .form(&[
                ("username", name),
                ("password", PASSWORD),
                ("_csrf", &csrf_field(&html)),
                ("next", "/"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "the login failed");
        let session = set_cookie(answer.headers(), "gpurent_session").expect("a session cookie");
        let mut user = ConsoleUser {
            http,
            base: app.base.clone(),
            cookie: format!("gpurent_session={session}"),
            csrf: String::new(),
        };
        let page = user.get("/account").await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        user.csrf = csrf_field(&page.body);
        user
    }

    async fn page(response: reqwest::Response) -> Page {
        Page {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.text().await.unwrap(),
        }
    }

    pub async fn get(&self, path: &str) -> Page {
        Self::page(
            self.http
                .get(format!("{}{path}", self.base))
                .header(COOKIE, &self.cookie)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// Posts a form as the page's own would: with this session's CSRF token.
    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        let mut fields = fields.to_vec();
        fields.push(("_csrf", &self.csrf));
        self.post_raw(path, &fields).await
    }

    /// Posts exactly these fields (a forged form has no token).
    pub async fn post_raw(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        Self::page(
            self.http
                .post(format!("{}{path}", self.base))
                .header(COOKIE, &self.cookie)
                .form(fields)
                .send()
                .await
                .unwrap(),
        )
        .await
    }
}

/// English words any page may show in Chinese: names of things, units, the currency.
const UNTRANSLATED: &[&str] = &[
    "gpurent", "english", "gpu", "gpus", "cpu", "ssh", "api", "csv", "usd", "utc", "mib", "gib",
    "cuda", "ecc", "xid", "rtx", "nvidia", "http", "https",
];

/// Removes `<tag ...>...</tag>` elements (not nested in themselves).
fn drop_elements(html: &str, tag: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    let open = format!("<{tag}");
    let close = format!("</{tag}>");
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        // `<code` but not `<codex`.
        if !after.starts_with(['>', ' ']) {
            out.push_str(&rest[..start + open.len()]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..start]);
        match after.find(&close) {
            Some(end) => rest = &after[end + close.len()..],
            None => rest = "",
        }
    }
    out.push_str(rest);
    out
}

/// The values of an attribute wherever it is in the page (text a person reads: `title`,
/// `aria-label`, the question of `data-confirm`).
fn attribute_values(html: &str, name: &str) -> Vec<String> {
    let marker = format!(" {name}=\"");
    html.match_indices(&marker)
        .filter_map(|(i, _)| html[i + marker.len()..].split('"').next())
        .map(str::to_owned)
        .collect()
}

/// The English words (ASCII, three letters or more) in a page's visible text outside `code`,
/// `pre`, `textarea`, scripts and styles, and in its `title`, `aria-label` and `data-confirm`,
/// but for those of [`UNTRANSLATED`] and `data` (the names a test made).
pub fn untranslated(html: &str, data: &[&str]) -> Vec<String> {
    let mut text = html.to_owned();
    for tag in ["script", "style", "code", "pre", "textarea"] {
        text = drop_elements(&text, tag);
    }
    let mut readable: Vec<String> = Vec::new();
    for attr in ["title", "aria-label", "data-confirm"] {
        readable.extend(attribute_values(&text, attr));
    }
    let mut plain = String::with_capacity(text.len());
    let mut in_tag = false;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                plain.push(' ');
            }
            c if !in_tag => plain.push(c),
            _ => {}
        }
    }
    readable.push(plain);
    let data: Vec<String> = data.iter().map(|d| d.to_ascii_lowercase()).collect();
    let mut found: Vec<String> = Vec::new();
    for text in &readable {
        let text = text
            .replace("&amp;", " ")
            .replace("&lt;", " ")
            .replace("&gt;", " ")
            .replace("&quot;", " ")
            .replace("&#39;", " ");
        for word in text.split(|c: char| !c.is_ascii_alphabetic()) {
            let lower = word.to_ascii_lowercase();
            if word.len() >= 3
                && !UNTRANSLATED.contains(&lower.as_str())
                && !data.iter().any(|d| d.contains(&lower))
            {
                found.push(word.to_owned());
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Asserts that the page in Chinese has no English left in what a person reads.
#[track_caller]
pub fn assert_translated(page: &Page, data: &[&str]) {
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("<html lang=\"zh-CN\""), "{}", page.body);
    let words = untranslated(&page.body, data);
    assert!(
        words.is_empty(),
        "English words in the Chinese page: {words:?}\n{}",
        page.body
    );
}

#[test]
fn the_check_finds_english_outside_code() {
    let html = "<html><body><p>余额 <code>gpurent ssh ID</code> Balance</p>\
                <form data-confirm=\"Stop it?\"><button>停止</button></form>\
                <span>tina · 租户</span> 12.50 USD</body></html>";
    assert_eq!(untranslated(html, &["tina"]), ["Balance", "Stop"]);
}
