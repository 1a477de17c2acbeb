//! The web console without a browser: sessions, CSRF, the policy table's pages, the reserve
//! form, the instance pages and both languages, over real HTTP against a real server.

use gpurent_server::{Access, POLICY};
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::{Tenant, TestApp, TestAppBuilder};
use crate::console_support::{
    assert_secure_headers, field_value, login, login_admin, login_with, no_redirects, untranslated,
    Console, PASSWORD,
};

fn app() -> TestAppBuilder {
    TestApp::with(Backend::Sqlite).with_config(|c| {
        c.rate_limits = gpurent_server::RateLimits {
            per_token: None,
            per_address: None,
        }
    })
}

/// A server with a ready node of two GPUs.
async fn ready_node() -> TestApp {
    let app = app().with_sim_gpus("2xRTX4090").start().await;
    app.wait_nodes_ready().await;
    app
}

/// ... and tenant alice, logged in to the console.
async fn alice_at_a_ready_node() -> (TestApp, Tenant, Console) {
    let app = ready_node().await;
    let alice = app.tenant("alice", "10").await;
    let console = login(&app, &alice, "alice").await;
    (app, alice, console)
}

/// Every console entry of the table is routed, and without a session leads to the login
/// page (a GET with where it came from), never to the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_needs_a_session() {
    let app = app().start().await;
    let http = no_redirects();
    let mut checked = 0;
    for (method, route, access) in POLICY {
        if !matches!(access, Access::Page(_)) {
            continue;
        }
        let path = route
            .replace("{id}", "r_none")
            .replace("{node}", "n_none")
            .replace("{name}", "x");
        let url = format!("{}{path}", app.base);
        let answer = match *method {
            "GET" => http.get(&url).send().await.unwrap(),
            _ => http
                .request(method.parse().unwrap(), &url)
                .form(&[("a", "b")])
                .send()
                .await
                .unwrap(),
        };
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "{method} {path}");
        let to = answer.headers()["location"].to_str().unwrap().to_owned();
        assert!(to.starts_with("/login"), "{method} {path} -> {to}");
        if *method == "GET" && path != "/" {
            assert!(to.contains("next=%2F"), "{method} {path} -> {to}");
        }
        checked += 1;
    }
    assert!(checked >= 8, "{checked}");
    // An unknown page is a page, not the API's JSON.
    let page = http
        .get(format!("{}/no/such/page", app.base))
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::NOT_FOUND);
    assert!(page.text().await.unwrap().contains("<html lang=\"en\">"));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logging_in_and_out() {
    let app = app().start().await;
    let alice = app.tenant("alice", "10").await;
    // Before a password is set, and with a wrong one: the form again, with why, and no cookie.
    let refused = login_with(&app.base, "alice", PASSWORD).await.unwrap_err();
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert!(refused.html.contains("role=\"alert\""), "{}", refused.html);
    let console = login(&app, &alice, "alice").await;
    let wrong = login_with(&app.base, "alice", "not the password")
        .await
        .unwrap_err();
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    // A login form posted without the cookie it came with is refused (login CSRF).
    let forged = no_redirects()
        .post(format!("{}/login", app.base))
        .form(&[
            ("username", "alice"),
            ("password", PASSWORD),
            ("_csrf", "gpl_guess"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    // The session: a tenant starts at its instances.
    let home = console.get("/").await;
    assert_eq!(home.status, StatusCode::SEE_OTHER);
    assert_eq!(home.location(), Some("/instances"));
    let page = console.get("/instances").await;
    assert_eq!(page.status, StatusCode::OK);
    assert_secure_headers(&page);
    assert!(page.html.contains("alice"), "the viewer's name is shown");
    // Logging out revokes the session's token: the old cookie opens nothing.
    let out = console.post("/logout", &[]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    let cleared = out.headers.get_all("set-cookie").iter().any(|c| {
        let c = c.to_str().unwrap();
        c.starts_with("gpurent_session=;") && c.contains("Max-Age=0")
    });
    assert!(cleared, "{:?}", out.headers);
    let after = console.get("/instances").await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
    assert!(after.location().unwrap().starts_with("/login"));
    // Each role has its own start page.
    let admin = login_admin(&app).await;
    assert_eq!(admin.get("/").await.location(), Some("/admin"));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_httponly_strict_and_expires_with_its_token() {
    let app = app().start().await;
    let alice = app.tenant("alice", "10").await;
    let (status, _) = alice
        .client
        .post("/api/v1/users/me/password", &json!({"password": PASSWORD}))
        .await;
    assert!(status.is_success());
    let http = no_redirects();
    let form = http
        .get(format!("{}/login", app.base))
        .send()
        .await
        .unwrap();
    let login_cookie = form.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(login_cookie.contains("HttpOnly") && login_cookie.contains("SameSite=Strict"));
    let value = login_cookie.split(';').next().unwrap().to_owned();
    let csrf = field_value(&form.text().await.unwrap(), "_csrf").unwrap();
    let answer = http
        .post(format!("{}/login", app.base))
        .header("cookie", value)
        .form(&[
            ("username", "alice"),
            ("password", PASSWORD),
            ("_csrf", csrf.as_str()),
        ])
        .send()
        .await
        .unwrap();
    let session = answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("gpurent_session="))
        .unwrap();
    assert!(
        session.contains("; HttpOnly") && session.contains("; SameSite=Strict"),
        "{session}"
    );
    assert!(!session.contains("Secure"), "plain HTTP: {session}");
    // 12 hours, the session token's life (a second or two may have passed).
    let max_age: i64 = session
        .split("Max-Age=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((12 * 3600 - 5..=12 * 3600).contains(&max_age), "{max_age}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_without_their_csrf_token_or_from_another_site_are_refused() {
    let (app, alice, console) = alice_at_a_ready_node().await;
    let form = [("gpu_type", "RTX 4090"), ("hours", "1")];
    let missing = console.post_raw("/offers", &form, &[]).await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN);
    assert!(missing.html.contains("CSRF"), "{}", missing.html);
    let wrong = console
        .post_raw(
            "/offers",
            &[("gpu_type", "RTX 4090"), ("hours", "1"), ("_csrf", "0000")],
            &[],
        )
        .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    let with_token = [
        ("gpu_type", "RTX 4090"),
        ("hours", "1"),
        ("_csrf", console.csrf.as_str()),
    ];
    let foreign = console
        .post_raw("/offers", &with_token, &[("origin", "http://evil.example")])
        .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    // Another session's token is not this one's.
    let bob = app.tenant("bob", "10").await;
    let bobs = login(&app, &bob, "bob").await;
    let crossed = console
        .post_raw(
            "/offers",
            &[
                ("gpu_type", "RTX 4090"),
                ("hours", "1"),
                ("_csrf", bobs.csrf.as_str()),
            ],
            &[],
        )
        .await;
    assert_eq!(crossed.status, StatusCode::FORBIDDEN);
    let (_, list) = alice.client.get("/api/v1/reservations").await;
    assert_eq!(
        list.as_array().unwrap().len(),
        0,
        "nothing was reserved: {list}"
    );
    // The same form with its token reserves.
    let done = console.post_raw("/offers", &with_token, &[]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserving_watching_and_stopping_through_the_pages() {
    let (app, alice, console) = alice_at_a_ready_node().await;
    // The offers and the price the form shows before it is sent: the billing crate's.
    let offers = console.get("/offers").await;
    assert!(offers.html.contains("data-form=\"reserve\""));
    for name in [
        "gpu_type",
        "gpu_count",
        "vram_gb",
        "vram_fraction",
        "hours",
        "tier",
        "bid",
        "image",
        "command",
    ] {
        assert!(offers.html.contains(&format!("name=\"{name}\"")), "{name}");
    }
    // A share as a fraction of the card (its 24,564 MiB), or all of it by GB: its part of the
    // card's 2.50.
    for (ask, price) in [("vram_fraction=0.5", "1.25"), ("vram_gb=24", "2.50")] {
        let quote = console
            .get(&format!("/offers/quote?gpu_type=RTX+4090&{ask}&hours=1"))
            .await;
        assert!(
            quote.html.starts_with(&format!("{price} USD per hour")),
            "{ask}: {}",
            quote.html
        );
    }
    let quote = console
        .get("/offers/quote?gpu_type=RTX+4090&gpu_count=2&hours=3")
        .await;
    assert_eq!(quote.status, StatusCode::OK);
    assert!(
        quote
            .html
            .starts_with("5.00 USD per hour · 15.00 USD for 3 h"),
        "{}",
        quote.html
    );
    let bad = console
        .get("/offers/quote?gpu_type=RTX+4090&tier=spot&bid=0.01&hours=1")
        .await;
    assert!(
        bad.html.contains("below the lowest spot price"),
        "{}",
        bad.html
    );
    // A refusal shows the form again with the API's reason, and keeps what was typed.
    let key = field_value(&offers.html, "idempotency_key").unwrap();
    let too_many = console
        .post(
            "/offers",
            &[
                ("gpu_type", "RTX 4090"),
                ("gpu_count", "3"),
                ("hours", "1"),
                ("command", "echo kept"),
            ],
        )
        .await;
    assert_eq!(too_many.status, StatusCode::CONFLICT, "{}", too_many.html);
    assert!(
        too_many.html.contains("role=\"alert\"") && too_many.html.contains("value=\"echo kept\"")
    );
    // Reserved: to its page. Posted twice with its key (a double click), reserved once.
    let fields = [
        ("gpu_type", "RTX 4090"),
        ("hours", "1"),
        ("command", "sh -c 'echo from-the-form; sleep 600'"),
        ("env", "A=1\n"),
        ("idempotency_key", key.as_str()),
    ];
    let done = console.post("/offers", &fields).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    let to = done.location().unwrap().to_owned();
    let again = console.post("/offers", &fields).await;
    assert_eq!(again.location(), Some(to.as_str()));
    let id = to.strip_prefix("/instances/").unwrap().to_owned();
    let (_, list) = alice.client.get("/api/v1/reservations").await;
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(
        list[0]["env"],
        serde_json::Value::Null,
        "env is not shown back"
    );
    app.wait_status(&alice.client, &id, "running").await;
    let page = console.get(&to).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_secure_headers(&page);
    for needle in [
        "data-field=\"status\" data-status=\"running\">running<",
        "data-field=\"log\"",
        "data-field=\"terminal\"",
        "data-action=\"stop\"",
    ] {
        assert!(page.html.contains(needle), "{needle} in {}", page.html);
    }
    let list_page = console.get("/instances").await;
    assert!(list_page
        .html
        .contains(&format!("data-reservation-id=\"{id}\"")));
    assert!(
        list_page.html.contains("data-live="),
        "the list updates itself"
    );
    // The log, as console.js follows it.
    let log = console.get(&format!("/instances/{id}/log?offset=0")).await;
    assert_eq!(log.status, StatusCode::OK);
    assert!(log.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    assert!(log.headers.contains_key("x-log-next-offset"));
    // Stopped from its page.
    let stop = console.post(&format!("/instances/{id}/stop"), &[]).await;
    assert_eq!(stop.status, StatusCode::SEE_OTHER, "{}", stop.html);
    let (_, r) = alice
        .client
        .get(&format!("/api/v1/reservations/{id}"))
        .await;
    assert!(
        ["stopping", "stopped"].contains(&r["status"].as_str().unwrap()),
        "{r}"
    );
    let after = console.get(&to).await;
    assert!(
        !after.html.contains("data-action=\"stop\""),
        "no stop once stopping"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_instance_is_not_found() {
    let app = ready_node().await;
    let alice = app.tenant("alice", "10").await;
    let bob = app.tenant("bob", "10").await;
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let id = r["id"].as_str().unwrap();
    let bobs = login(&app, &bob, "bob").await;
    for path in [
        format!("/instances/{id}"),
        format!("/instances/{id}/log?offset=0"),
    ] {
        let page = bobs.get(&path).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{path}");
        assert!(!page.html.contains(id), "{path} tells nothing of it");
    }
    let stop = bobs.post(&format!("/instances/{id}/stop"), &[]).await;
    assert_eq!(stop.status, StatusCode::NOT_FOUND);
    let (_, r) = alice
        .client
        .get(&format!("/api/v1/reservations/{id}"))
        .await;
    assert_ne!(r["status"], "stopping");
    assert!(!bobs.get("/instances").await.html.contains(id));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_speak_the_browsers_language_or_the_chosen_one() {
    let app = ready_node().await;
    let alice = app.tenant("alice", "10").await;
    let (_, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    let id = r["id"].as_str().unwrap().to_owned();
    let console = login(&app, &alice, "alice").await;
    let zh = console
        .get_with("/offers", &[("accept-language", "zh-CN,zh;q=0.9,en;q=0.5")])
        .await;
    assert!(zh.html.contains("<html lang=\"zh-CN\">"));
    // Chosen with ?lang=, remembered in a cookie.
    let en = console
        .get_with("/offers?lang=en", &[("accept-language", "zh-CN")])
        .await;
    assert!(en.html.contains("<html lang=\"en\">"));
    let remembered = en
        .headers
        .get_all("set-cookie")
        .iter()
        .any(|c| c.to_str().unwrap().starts_with("gpurent_lang=en;"));
    assert!(remembered);
    for path in ["/offers", "/instances", &format!("/instances/{id}")] {
        let page = console.get(&format!("{path}?lang=zh-CN")).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert!(page.html.contains("<html lang=\"zh-CN\">"), "{path}");
        let english = untranslated(&page.html);
        assert!(english.is_empty(), "{path}: untranslated {english:?}");
    }
    let login_zh = no_redirects()
        .get(format!("{}/login?lang=zh-CN", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        untranslated(&login_zh).is_empty(),
        "{:?}",
        untranslated(&login_zh)
    );
    // And the English pages are English (the check can fail).
    assert!(!untranslated(&console.get("/offers?lang=en").await.html).is_empty());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_files_are_versioned_cached_and_gzipped() {
    let app = app().start().await;
    let http = no_redirects();
    let login = http
        .get(format!("{}/login", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let at = login.find("/assets/console.js?v=").unwrap();
    let url = &login[at..at + login[at..].find('"').unwrap()];
    let js = http
        .get(format!("{}{url}", app.base))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(js.status(), StatusCode::OK);
    assert_eq!(js.headers()["content-encoding"], "gzip");
    assert!(js.headers()["cache-control"]
        .to_str()
        .unwrap()
        .contains("immutable"));
    let plain = http.get(format!("{}{url}", app.base)).send().await.unwrap();
    assert!(plain.headers().get("content-encoding").is_none());
    assert!(plain.text().await.unwrap().contains("use strict"));
    let none = http
        .get(format!("{}/assets/nope.js", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), StatusCode::NOT_FOUND);
    app.shutdown().await;
}
