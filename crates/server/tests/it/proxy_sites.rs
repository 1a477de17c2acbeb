//! Issue 31's first finding, through the real proxy and tunnel: a tenant's app is served for
//! browsers only on the apps' site (`ID-PORT.localhost` by default), never on the console's;
//! a `gpurent open` link goes there only from its owner's console session (anyone else's gets
//! a page that says whose app it is); an app can set none of the control plane's cookies; the
//! console's own path form is for bearer tokens only, sandboxed and without cookies.

use gpurent_server::ServerConfig;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::Value;

use crate::app::Tenant;
use crate::both_stores;
use crate::console_support::{login, Console};
use crate::proxy_support::{cookie_pair, setup, Setup, APP_PORT, DEAD_PORT, OWN_COOKIE};

fn as_user(s: &Setup, token: &str) -> Tenant {
    Tenant {
        id: String::new(),
        client: s.app.client(Some(token)),
    }
}

/// GET `path` on the test server as `host`, with `cookie`: status, headers, body.
async fn get_as(
    s: &Setup,
    host: &str,
    path: &str,
    cookie: Option<&str>,
) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let mut request = s.http.get(s.url(path)).header("host", host);
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    let r = request.send().await.unwrap();
    let status = r.status();
    let headers = r.headers().clone();
    (status, headers, r.text().await.unwrap())
}

fn header(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| v.to_str().unwrap_or_default().to_owned())
}

/// A `gpurent open` link: to the console's `/open/LINK`; without a session, the login page
/// first; another tenant's session gets a page naming the owner and the link stays unused;
/// the owner's goes on with a one-time ticket to the app's own host, where it becomes a cookie
/// for that app only, never an API token and never good on the console's site.
async fn a_link_opens_the_app_for_its_owner_only(backend: Backend) {
    let s = setup(backend, None).await;
    let rid = &s.rid;
    let addr = s.server_addr();
    let link = s.link(APP_PORT).await;
    let url = link["url"].as_str().unwrap().to_owned();
    assert!(
        url.starts_with(&format!("http://{addr}/open/gpl_")),
        "{url}"
    );
    let host = s.app_host(APP_PORT);
    assert_eq!(link["app_url"], format!("http://{host}/"));

    // No session: log in first, then back to the link.
    let (status, location, cookie) = s.visit(&url).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(
        location
            .as_deref()
            .unwrap()
            .starts_with("/login?next=%2Fopen%2Fgpl_"),
        "{location:?}"
    );
    assert!(cookie.is_none());

    // Someone else's browser: whose app it is, and nothing done.
    let owner: Console = login(&s.app, &as_user(&s, &s.owner), "olga").await;
    let victim: Console = login(&s.app, &as_user(&s, &s.stranger), "sam").await;
    let r = s
        .http
        .get(&url)
        .header("cookie", format!("gpurent_session={}", victim.cookie))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.headers().get("location").is_none());
    assert!(r.headers().get("set-cookie").is_none());
    let page = r.text().await.unwrap();
    assert!(page.contains(r#"data-field="owner">olga<"#), "{page}");
    assert!(page.contains(r#"data-field="viewer">sam<"#), "{page}");
    assert!(page.contains("Nothing was done"), "{page}");

    // The owner's browser: on to the app's host with a ticket; the link is then used up.
    let as_owner = format!("gpurent_session={}", owner.cookie);
    let r = s
        .http
        .get(&url)
        .header("cookie", &as_owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let to = header(r.headers(), "location").unwrap();
    let prefix = format!("http://{host}/?gpurent_link=gpt_");
    assert!(to.starts_with(&prefix), "{to}");
    let r = s
        .http
        .get(&url)
        .header("cookie", &as_owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "a link opens once");
    let ticket = to.split_once('?').unwrap().1.to_owned();

    // A link is no ticket: it opens nothing on the apps' site.
    let link_token = url.rsplit('/').next().unwrap();
    let (status, _, _) = get_as(&s, &host, &format!("/?gpurent_link={link_token}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The ticket on another port's host opens nothing (and is not used up by trying).
    let other = s.app_host(DEAD_PORT);
    let (status, _, _) = get_as(&s, &other, &format!("/?{ticket}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, headers, _) = get_as(&s, &host, &format!("/lab?{ticket}&then=1"), None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(header(&headers, "location").as_deref(), Some("/lab?then=1"));
    let set = header(&headers, "set-cookie").expect("a cookie");
    for attribute in ["Path=/;", "HttpOnly", "SameSite=Lax", "Max-Age=43200"] {
        assert!(set.contains(attribute), "{set} lacks {attribute}");
    }
    assert!(!set.contains("Domain"), "host-only: {set}");
    assert!(!set.contains("Secure"), "no TLS here: {set}");
    let pair = cookie_pair(&set);
    assert!(pair.starts_with("gpurent_proxy=gps_"), "{pair}");
    let (status, _, _) = get_as(&s, &host, &format!("/?{ticket}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a ticket works once");

    // The cookie opens the app, and neither it nor a console cookie reaches the app.
    let jar = format!("theme=dark; {pair}; gpurent_session={}", owner.cookie);
    let (status, _, body) = get_as(&s, &host, "/echo", Some(&jar)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["uri"], "/echo");
    assert_eq!(echo["headers"]["cookie"], "theme=dark", "{echo}");
    // Not from another app of the same site (another tenant's, under a shared apps' domain),
    // which the browser would send it with; the app's own requests, and navigations from
    // elsewhere, are the cookie's.
    for (fetch_site, expected) in [
        ("same-site", StatusCode::NOT_FOUND),
        ("same-origin", StatusCode::OK),
        ("cross-site", StatusCode::OK),
    ] {
        let r = s
            .http
            .get(s.url("/echo"))
            .header("host", &host)
            .header("cookie", &pair)
            .header("sec-fetch-site", fetch_site)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), expected, "Sec-Fetch-Site: {fetch_site}");
    }
    // ... for that app's host only: not another port, not the console's path form.
    let (status, _, _) = get_as(&s, &other, "/echo", Some(&pair)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}/echo")))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // Never an API token.
    let r = s
        .http
        .get(s.url("/api/v1/reservations"))
        .bearer_auth(pair.trim_start_matches("gpurent_proxy="))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // The instance page's link: the owner's session goes on with a ticket, anyone else's is
    // told there is no such port.
    let page = format!("/instances/{rid}/ports/{APP_PORT}");
    let r = s
        .http
        .get(s.url(&page))
        .header("cookie", &as_owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(header(r.headers(), "location")
        .unwrap()
        .starts_with(&prefix));
    let r = s
        .http
        .get(s.url(&page))
        .header("cookie", format!("gpurent_session={}", victim.cookie))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    s.app.shutdown().await;
}
both_stores!(owner_only_link, a_link_opens_the_app_for_its_owner_only);

/// An app sets every cookie name of the control plane's: on its own host only its own cookie
/// gets through; on the console's path form (bearer) no cookie at all, and the answer is
/// sandboxed; the owner's console session never opens the path form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_sets_no_cookie_of_ours() {
    let s = setup(Backend::Sqlite, None).await;
    let rid = &s.rid;
    let host = s.app_host(APP_PORT);
    let pair = s.app_cookie().await;

    let (status, headers, _) = get_as(&s, &host, "/set-cookies", Some(&pair)).await;
    assert_eq!(status, StatusCode::OK);
    let set: Vec<&str> = headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(set, vec![OWN_COOKIE], "only the app's own cookie");
    assert!(
        headers.get("content-security-policy").is_none(),
        "the app's own origin"
    );

    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}/set-cookies")))
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("set-cookie").is_none(), "{:?}", r.headers());
    assert_eq!(
        header(r.headers(), "content-security-policy").as_deref(),
        Some("sandbox")
    );

    // The console's session is no key to the path form (an app there would run with it).
    let owner: Console = login(&s.app, &as_user(&s, &s.owner), "olga").await;
    // A ticket redeemed at a path that starts `//` goes on to `/`, never to another host.
    let r = s
        .http
        .get(s.url(&format!("/instances/{rid}/ports/{APP_PORT}")))
        .header("cookie", format!("gpurent_session={}", owner.cookie))
        .send()
        .await
        .unwrap();
    let to = header(r.headers(), "location").unwrap();
    let ticket = to.split_once('?').unwrap().1;
    let (status, headers, _) = get_as(&s, &host, &format!("//evil.example/x?{ticket}"), None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(header(&headers, "location").as_deref(), Some("/"));
    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}/echo")))
        .header("cookie", format!("gpurent_session={}", owner.cookie))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    s.app.shutdown().await;
}

/// The console is never served on the apps' site: `localhost` sends its pages to
/// `127.0.0.1`, a host under it that names no app finds nothing; the API and health checks
/// still answer there (bearer tokens carry no cookie).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_kept_off_the_apps_site() {
    let s = setup(Backend::Sqlite, None).await;
    let port = s.server_addr().port();
    let localhost = format!("localhost:{port}");
    for path in [
        "/",
        "/login?next=%2Faccount",
        "/account",
        "/assets/console.css",
    ] {
        let (status, headers, _) = get_as(&s, &localhost, path, None).await;
        assert_eq!(status, StatusCode::PERMANENT_REDIRECT, "{path}");
        assert_eq!(
            header(&headers, "location"),
            Some(format!("http://127.0.0.1:{port}{path}")),
            "{path}"
        );
        assert!(headers.get("set-cookie").is_none(), "{path}");
    }
    let (status, _, _) = get_as(&s, &format!("x.localhost:{port}"), "/login", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let r = s
        .http
        .get(s.url("/api/v1/reservations"))
        .header("host", &localhost)
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (status, _, _) = get_as(&s, &localhost, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK);
    s.app.shutdown().await;
}

/// `--apps-domain`: `ID-PORT.DOMAIN` reaches the app with the path at its root (API paths
/// too are the app's there); the domain itself serves no console page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apps_domain_puts_the_app_at_the_root() {
    let s = setup(
        Backend::Sqlite,
        Some(|c: &mut ServerConfig| c.apps_domain = "apps.test".into()),
    )
    .await;
    let rid = &s.rid;
    let port = s.server_addr().port();
    let host = format!("{rid}-{APP_PORT}.apps.test:{port}");
    let r = s
        .http
        .get(s.url("/api/v1/reservations?x=1"))
        .header("host", &host)
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["uri"], "/api/v1/reservations?x=1", "{echo}");
    assert_eq!(echo["headers"]["host"], host.as_str());
    let r = s
        .http
        .get(s.url("/"))
        .header("host", &host)
        .bearer_auth(&s.stranger)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "a stranger there");
    let link = s.link(APP_PORT).await;
    assert_eq!(link["app_url"], format!("http://{host}/"));
    let (status, _, _) = get_as(&s, &format!("apps.test:{port}"), "/login", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Other hosts still get the API and the console.
    let (status, _) = s.owner_client().get("/api/v1/reservations").await;
    assert_eq!(status, StatusCode::OK);
    s.app.shutdown().await;
}
