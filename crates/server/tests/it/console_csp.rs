//! The console's CSP allows no inline script and no inline style anywhere: the terminal's page
//! alone adds a style nonce, new with every response, and the charts (the reports', an
//! instance's GPUs', an endpoint's replicas) need none.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::{self, login_admin, no_redirects, Page};

fn csp(page: &Page) -> &str {
    page.header("content-security-policy")
}

/// No `'unsafe-inline'` (nor `'unsafe-eval'`, `'unsafe-hashes'`), scripts and styles from
/// this site only, and no inline style the page would need it for.
#[track_caller]
fn assert_strict(what: &str, page: &Page) {
    let csp = csp(page);
    assert!(!csp.contains("unsafe-"), "{what}: {csp}");
    assert!(csp.contains("script-src 'self';"), "{what}: {csp}");
    assert!(csp.contains("style-src 'self'"), "{what}: {csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
    assert!(
        !page.html.contains(" style=") && !page.html.contains("<style"),
        "{what} has an inline style:\n{}",
        page.html
    );
}

/// The nonce of a page's `style-src`, if it has one.
fn nonce(page: &Page) -> Option<String> {
    let csp = csp(page);
    let at = csp.find("'nonce-")? + 7;
    let end = csp[at..].find('\'')?;
    Some(csp[at..at + end].to_owned())
}

async fn no_console_page_allows_inline_styles(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let tia = app.tenant("tia", "100").await;
    let (status, r) = tia
        .client
        .reserve(json!({"gpu_type": "RTX 4090", "hours": 1, "command": ["sleep", "600"]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&tia.client, &id, "running").await;
    let tenant = console_support::login(&app, &tia, "tia").await;
    let admin = login_admin(&app).await;

    // The login page, before any session, and an error page.
    let login = no_redirects()
        .get(format!("{}/login", app.base))
        .send()
        .await
        .unwrap();
    let login = Page {
        status: login.status(),
        headers: login.headers().clone(),
        html: login.text().await.unwrap(),
    };
    assert_strict("/login", &login);
    assert_strict("a 404", &tenant.get("/instances/r_nothing").await);
    assert_strict("a 403", &tenant.get("/admin").await);
    for path in [
        "/offers",
        "/instances",
        "/endpoints",
        "/billing",
        "/account",
    ] {
        let page = tenant.get(path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert_strict(path, &page);
        assert_eq!(nonce(&page), None, "{path}: {}", csp(&page));
    }
    let today = chrono::Utc::now().format("%Y-%m-%d");
    for path in [
        "/nodes".to_owned(),
        "/admin".into(),
        "/admin/users".into(),
        "/admin/reservations".into(),
        "/admin/events".into(),
        "/admin/audit".into(),
        "/admin/audit/verify".into(),
        "/admin/ledger".into(),
        format!("/admin/reports?date={today}"),
    ] {
        let page = admin.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert_strict(&path, &page);
    }

    // The terminal's page: a nonce for the `<style>` elements xterm.js makes, given only to
    // terminal.js (which hands it on), and another with every response, live ones too.
    let path = format!("/instances/{id}");
    let mut seen = std::collections::HashSet::new();
    for headers in [&[][..], &[][..], &[("x-gpurent-live", "1")][..]] {
        let page = tenant.get_with(&path, headers).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.html);
        assert_strict(&path, &page);
        let nonce = nonce(&page).unwrap_or_else(|| panic!("a style nonce: {}", csp(&page)));
        assert!(
            nonce.len() >= 22 && nonce.chars().all(|c| c.is_ascii_alphanumeric()),
            "{nonce}"
        );
        assert!(
            csp(&page).contains(&format!("style-src 'self' 'nonce-{nonce}';")),
            "{}",
            csp(&page)
        );
        assert_eq!(
            page.html.matches(nonce.as_str()).count(),
            1,
            "{}",
            page.html
        );
        let tag = &page.html[..page.html.find(nonce.as_str()).unwrap()];
        let tag = &tag[tag.rfind('<').unwrap()..];
        assert!(
            tag.starts_with("<script src=\"/assets/terminal.js?v=") && tag.ends_with("nonce=\""),
            "{tag}"
        );
        assert!(seen.insert(nonce), "a nonce is never sent twice");
    }

    // The charts: presentation attributes only, no style at all.
    let (status, made) = tia
        .client
        .post(
            "/api/v1/endpoints",
            &json!({"name": "web", "gpu_type": "rtx4090", "command": ["app"], "port": 8000}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let page = tenant.get("/endpoints/web").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    assert_strict("/endpoints/web", &page);
    assert_eq!(nonce(&page), None, "{}", csp(&page));
    for (chart, svg) in [
        ("gpu", tenant.get(&format!("/instances/{id}/gpu.svg")).await),
        ("replicas", tenant.get("/endpoints/web/replicas.svg").await),
    ] {
        assert_eq!(svg.status, StatusCode::OK, "{chart}: {}", svg.html);
        assert_eq!(
            csp(&svg),
            "default-src 'none'; frame-ancestors 'none'",
            "{chart}"
        );
        assert!(
            !svg.html.contains("style=") && !svg.html.contains("<style"),
            "{chart}: {}",
            svg.html
        );
    }
    for chart in ["heatmap", "timeline"] {
        let svg = admin
            .get(&format!("/admin/reports/{chart}.svg?date={today}"))
            .await;
        assert_eq!(svg.status, StatusCode::OK, "{chart}: {}", svg.html);
        assert_eq!(
            csp(&svg),
            "default-src 'none'; frame-ancestors 'none'",
            "{chart}"
        );
        assert!(
            !svg.html.contains("style=") && !svg.html.contains("<style"),
            "{chart}: {}",
            svg.html
        );
    }
    app.shutdown().await;
}
both_stores!(console_csp, no_console_page_allows_inline_styles);
