//! The frame every console page shares (navigation by role, language switch, logout), its
//! security headers, error pages, and how money, times and statuses are shown.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use gpurent_types::{Money, Role};
use maud::{html, Markup, DOCTYPE};

use super::api::Failure;
use super::assets;
use super::lang::{query_lang, Lang, LANG_COOKIE};
use super::session::{Viewer, CSRF_FIELD};
use crate::state::AppState;

/// No inline script and no inline style, nothing from another origin, never in a frame. The
/// terminal's page adds a nonce for the `<style>` elements xterm.js makes ([`StyleNonce`]).
pub(crate) const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// A nonce for `style-src`: 128 random bits, made for one response and never again.
/// `assets/terminal.js` reads it from its own `<script nonce>` and gives it to the `<style>`
/// elements xterm.js creates; a `<style>` in markup never has it.
#[derive(Debug)]
pub(crate) struct StyleNonce(String);

impl StyleNonce {
    pub(crate) fn new() -> StyleNonce {
        StyleNonce(hex::encode(rand::random::<[u8; 16]>()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// The page's CSP: [`CSP`], and the style nonce where the page has one.
fn csp(nonce: Option<&StyleNonce>) -> HeaderValue {
    let Some(nonce) = nonce else {
        return HeaderValue::from_static(CSP);
    };
    let with = CSP.replacen(
        "style-src 'self'",
        &format!("style-src 'self' 'nonce-{}'", nonce.as_str()),
        1,
    );
    // Hex digits and the constant's own characters: always a valid header value.
    HeaderValue::from_str(&with).unwrap_or_else(|_| HeaderValue::from_static(CSP))
}

/// What every page handler knows about its request: the language, the viewer (none on the
/// login page), and the path it was asked at.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub lang: Lang,
    pub viewer: Option<Viewer>,
    pub path: String,
    /// `?lang=` was given: the choice is remembered in a cookie.
    remember: bool,
    pub secure: bool,
    pub peer: Option<axum::extract::ConnectInfo<crate::tls::Peer>>,
}

impl FromRequestParts<AppState> for Ctx {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query();
        Ok(Ctx {
            lang: Lang::of(query, &parts.headers),
            remember: query.and_then(query_lang).is_some(),
            viewer: parts.extensions.get::<Viewer>().cloned(),
            path: parts.uri.path().to_owned(),
            secure: state.config.tls.is_some(),
            peer: parts.extensions.get().cloned(),
        })
    }
}

impl Ctx {
    /// For a page shown before the handler runs (a refusal).
    pub(crate) fn for_error(lang: Lang, viewer: Option<Viewer>, path: String) -> Ctx {
        Ctx {
            lang,
            viewer,
            path,
            remember: false,
            secure: false,
            peer: None,
        }
    }

    /// The viewer of a page that needs one (`policy::authorize` let it in with one).
    pub(crate) fn viewer(&self) -> Result<&Viewer, PageError> {
        self.viewer
            .as_ref()
            .ok_or_else(|| PageError::internal("a console page without a session"))
    }

    pub(crate) fn api(&self, state: &AppState) -> Result<super::api::Api, PageError> {
        super::api::Api::new(state, self.viewer.as_ref(), self.peer.clone())
            .map_err(|f| self.failed(f))
    }

    pub(crate) fn role(&self) -> Option<Role> {
        self.viewer.as_ref().map(|v| v.user.role)
    }

    /// The hidden field every form carries.
    pub(crate) fn csrf_field(&self) -> Markup {
        let token = self.viewer.as_ref().map_or("", |v| v.csrf.as_str());
        html! { input type="hidden" name=(CSRF_FIELD) value=(token); }
    }

    /// An API call's failure as this page's error.
    pub(crate) fn failed(&self, failure: Failure) -> PageError {
        PageError {
            status: failure.status,
            code: failure.code,
            message: failure.message,
            lang: self.lang,
            viewer: self.viewer.clone().map(Box::new),
        }
    }

    /// The whole page: the frame around `body`, with its headers.
    pub(crate) fn page(&self, title: &str, body: Markup) -> Response {
        self.page_with_status(StatusCode::OK, title, body)
    }

    pub(crate) fn page_with_status(
        &self,
        status: StatusCode,
        title: &str,
        body: Markup,
    ) -> Response {
        self.render(status, title, body, None)
    }

    /// A page whose scripts make `<style>` elements (the terminal's), allowed by this nonce
    /// alone: `body` gives it to the script that needs it.
    pub(crate) fn page_with_style_nonce(
        &self,
        title: &str,
        body: Markup,
        nonce: &StyleNonce,
    ) -> Response {
        self.render(StatusCode::OK, title, body, Some(nonce))
    }

    fn render(
        &self,
        status: StatusCode,
        title: &str,
        body: Markup,
        nonce: Option<&StyleNonce>,
    ) -> Response {
        let l = self.lang;
        let markup = html! {
            (DOCTYPE)
            html lang=(l.code()) {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · gpurent" }
                    link rel="stylesheet" href=(assets::url("console.css"));
                    link rel="icon" href=(assets::url("favicon.svg")) type="image/svg+xml";
                    script src=(assets::url("console.js")) defer {}
                }
                body data-lang=(l.code()) {
                    a.skip href="#main" { (l.t("Skip to content", "跳到正文")) }
                    (self.header())
                    main id="main" tabindex="-1" {
                        h1 { (title) }
                        (body)
                    }
                }
            }
        };
        let mut response = (status, axum::response::Html(markup.into_string())).into_response();
        self.secure_headers(&mut response, nonce);
        response
    }

    fn secure_headers(&self, response: &mut Response, nonce: Option<&StyleNonce>) {
        let h = response.headers_mut();
        h.insert(header::CONTENT_SECURITY_POLICY, csp(nonce));
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
        // Pages show a user's own data: never kept by a shared cache or the back button.
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if self.remember {
            let one_year = 365 * 24 * 3600;
            h.append(
                header::SET_COOKIE,
                super::session::cookie_value(LANG_COOKIE, self.lang.code(), one_year, self.secure),
            );
        }
    }

    fn header(&self) -> Markup {
        let l = self.lang;
        let role = self.role();
        let nav: Vec<(&str, &str)> = match role {
            None => vec![],
            Some(role) => {
                let mut nav = vec![
                    ("/offers", l.t("Offers", "算力市场")),
                    ("/instances", l.t("Instances", "实例")),
                    ("/endpoints", l.t("Endpoints", "端点")),
                    ("/teams", l.t("Teams", "团队")),
                    ("/billing", l.t("Billing", "账单")),
                    ("/account", l.t("Account", "账户")),
                ];
                if matches!(role, Role::Host | Role::Admin) {
                    nav.push(("/nodes", l.t("Nodes", "节点")));
                }
                if role == Role::Admin {
                    nav.push(("/admin", l.t("Admin", "管理")));
                }
                nav
            }
        };
        let other = match l {
            Lang::En => (Lang::ZhCn, "中文"),
            Lang::ZhCn => (Lang::En, "English"),
        };
        html! {
            header.top {
                a.brand href="/" { "gpurent" }
                nav aria-label=(l.t("Main", "主导航")) {
                    ul {
                        @for (href, label) in &nav {
                            li {
                                a href=(href) aria-current=[self.path.starts_with(href).then_some("page")] { (label) }
                            }
                        }
                    }
                }
                div.who {
                    a lang=(other.0.code()) href={ (self.path) "?lang=" (other.0.code()) } { (other.1) }
                    @if let Some(viewer) = &self.viewer {
                        span.user { span translate="no" { (viewer.user.name) } " · " (role_name(l, viewer.user.role)) }
                        form.inline method="post" action="/logout" {
                            (self.csrf_field())
                            button.link type="submit" { (l.t("Log out", "退出登录")) }
                        }
                    }
                }
            }
        }
    }
}

pub(crate) fn role_name(l: Lang, role: Role) -> &'static str {
    match role {
        Role::Tenant => l.t("tenant", "租户"),
        Role::Host => l.t("host", "主机方"),
        Role::Admin => l.t("admin", "管理员"),
    }
}

/// A console page that could not be shown, as an HTML page with its status.
#[derive(Debug)]
pub(crate) struct PageError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub lang: Lang,
    /// Who was refused, for the page's navigation.
    pub viewer: Option<Box<Viewer>>,
}

impl PageError {
    pub(crate) fn internal(message: &str) -> PageError {
        PageError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal".into(),
            message: message.to_owned(),
            lang: Lang::En,
            viewer: None,
        }
    }

    pub(crate) fn new(
        lang: Lang,
        status: StatusCode,
        code: &str,
        message: impl Into<String>,
    ) -> PageError {
        PageError {
            status,
            code: code.to_owned(),
            message: message.into(),
            lang,
            viewer: None,
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let ctx = Ctx {
            lang: self.lang,
            viewer: self.viewer.map(|v| *v),
            path: "/".into(),
            remember: false,
            secure: false,
            peer: None,
        };
        error_page(&ctx, self.status, &self.code, &self.message)
    }
}

/// The page for a failure: what happened in the viewer's language, and the API's own words.
pub(crate) fn error_page(ctx: &Ctx, status: StatusCode, code: &str, message: &str) -> Response {
    let l = ctx.lang;
    let title = match status {
        StatusCode::NOT_FOUND => l.t("Not found", "未找到"),
        StatusCode::FORBIDDEN => l.t("Forbidden", "无权访问"),
        StatusCode::UNAUTHORIZED => l.t("Not logged in", "未登录"),
        StatusCode::TOO_MANY_REQUESTS => l.t("Too many requests", "请求过于频繁"),
        s if s.is_client_error() => l.t("That did not work", "操作未成功"),
        _ => l.t("Something went wrong", "出错了"),
    };
    let explain = match status {
        StatusCode::NOT_FOUND => l.t(
            "There is nothing here, or it is not yours to see.",
            "这里没有内容，或者您无权查看。",
        ),
        StatusCode::FORBIDDEN if code == "csrf" => l.t(
            "This form is out of date or came from another site; reload the page and try again.",
            "此表单已过期或来自其他网站；请刷新页面后重试。",
        ),
        StatusCode::FORBIDDEN => l.t(
            "Your role may not open this page.",
            "您的角色不能打开此页面。",
        ),
        _ => l.t("The control plane said:", "控制平面的答复："),
    };
    let body = html! {
        p { (explain) }
        @if status != StatusCode::NOT_FOUND && code != "forbidden" {
            p.error role="alert" { (raw(code)) " " (raw(message)) }
        }
        p { a href="/" { (l.t("Back to the start page", "返回首页")) } }
    };
    ctx.page_with_status(status, title, body)
}

/// An alert shown above a form that failed, with the API's words.
pub(crate) fn alert(l: Lang, failure: &Failure) -> Markup {
    html! {
        div.alert.error role="alert" {
            strong { (error_title(l, &failure.code)) } " "
            code { (failure.message) }
        }
    }
}

/// The API's error codes that a person meets at a form, in their language.
fn error_title(l: Lang, code: &str) -> &'static str {
    match code {
        "no_capacity" => l.t("No GPUs of this kind are free.", "没有空闲的此类 GPU。"),
        "insufficient_credit" => l.t("Not enough credit.", "余额不足。"),
        "validation" | "invalid" | "bad_request" => l.t("Please check the form.", "请检查表单。"),
        "not_found" => l.t("Not found.", "未找到。"),
        "forbidden" => l.t("Not allowed.", "不允许。"),
        "conflict" => l.t("That conflicts with the current state.", "与当前状态冲突。"),
        "unauthorized" => l.t("Wrong name or password.", "用户名或密码错误。"),
        "rate_limited" => l.t(
            "Too many requests; wait a moment.",
            "请求过于频繁，请稍候。",
        ),
        _ => l.t("That did not work.", "操作未成功。"),
    }
}

tokio::task_local! {
    /// The platform's currency, for the page being rendered: set by `console::guard` for every
    /// page behind a session, so that the forty places that show money need not carry it.
    pub(crate) static CURRENCY: String;
}

/// The platform's currency (the defaults' outside a page).
pub(crate) fn currency() -> String {
    CURRENCY
        .try_with(Clone::clone)
        .unwrap_or_else(|_| gpurent_billing::DEFAULT_CURRENCY.to_owned())
}

/// Money with the platform's currency.
pub(crate) fn money(m: Money) -> Markup {
    html! { span.money { (m) " " (currency()) } }
}

/// A UTC time, shown in the browser's time zone by `console.js` (UTC without scripts).
pub(crate) fn time(t: DateTime<Utc>) -> Markup {
    let iso = t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    html! { time datetime=(iso) { (t.format("%Y-%m-%d %H:%M:%S UTC")) } }
}

pub(crate) fn maybe_time(t: Option<DateTime<Utc>>) -> Markup {
    match t {
        Some(t) => time(t),
        None => html! { "—" },
    }
}

/// A reservation's status word (the contract's `data-field="status"`), colored by kind.
pub(crate) fn status(word: &str) -> Markup {
    html! { span.status data-field="status" data-status=(word) { (word) } }
}

/// Raw text from a program or a user (ids, images, commands): shown as is, and never
/// translated.
pub(crate) fn raw(text: &str) -> Markup {
    html! { code translate="no" { (text) } }
}

/// A command as a shell would take it back: each argument quoted when it needs to be
/// (`sh -c 'echo ready; sleep 600'`, not `sh -c echo ready; sleep 600`).
pub(crate) fn shell_line(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_inline_style_or_script_is_allowed_and_a_nonce_serves_one_response() {
        assert!(!CSP.contains("unsafe-"), "{CSP}");
        assert!(CSP.contains("style-src 'self';"), "{CSP}");
        assert!(CSP.contains("script-src 'self';"), "{CSP}");
        let (a, b) = (StyleNonce::new(), StyleNonce::new());
        assert_ne!(a.as_str(), b.as_str());
        assert_eq!(a.as_str().len(), 32);
        let with = csp(Some(&a));
        let with = with.to_str().unwrap_or_default();
        assert!(
            with.contains(&format!("style-src 'self' 'nonce-{}';", a.as_str())),
            "{with}"
        );
        assert!(!with.contains("unsafe-"), "{with}");
        assert!(with.contains("script-src 'self';"), "{with}");
        assert_eq!(csp(None), CSP);
    }

    #[test]
    fn a_command_is_shown_as_a_shell_would_take_it() {
        let args = ["sh", "-c", "echo ready; sleep 600"].map(String::from);
        assert_eq!(shell_line(&args), "sh -c 'echo ready; sleep 600'");
        let args = ["echo", "it's", ""].map(String::from);
        assert_eq!(shell_line(&args), r"echo 'it'\''s' ''");
    }
}
