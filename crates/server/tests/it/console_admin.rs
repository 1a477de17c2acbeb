//! The admin pages of the web console, through a real login cookie: the fleet at a glance
//! (GPUs by type, the queue, nodes out of service, revenue today), users (create with the
//! token shown once, credit, caps), everyone's reservations with filters and their cursor,
//! and events; each page refused to a tenant, forms refused without their CSRF token, and
//! each page in zh-CN without untranslated English.

use gpurent_store::Backend;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Tenant, TestApp};
use crate::both_stores;
use crate::console_support::{self, assert_secure_headers, field_value, Console, Page};

/// A new user of this role, logged in to the console.
pub async fn login_as(app: &TestApp, name: &str, role: &str) -> (Console, Tenant) {
    let user = app.user(name, role, "0").await;
    let console = console_support::login(app, &user, name).await;
    (console, user)
}

/// Node statuses are status words too, like the reservations' the support module allows.
const NODE_STATUSES: &[&str] = &["ready", "unhealthy", "draining", "unreachable"];

/// English words left untranslated on a zh-CN page.
pub fn untranslated(html: &str) -> Vec<String> {
    console_support::untranslated(html)
        .into_iter()
        .filter(|w| !NODE_STATUSES.contains(&w.as_str()))
        .collect()
}

/// The page under `?lang=zh-CN` is in Chinese, with no English word left untranslated.
pub async fn assert_chinese(console: &Console, path: &str) {
    let sep = if path.contains('?') { '&' } else { '?' };
    let page = console.get(&format!("{path}{sep}lang=zh-CN")).await;
    assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.html);
    assert!(page.html.contains("<html lang=\"zh-CN\""), "{path}");
    let words = untranslated(&page.html);
    assert!(
        words.is_empty(),
        "{path} in zh-CN has untranslated English: {words:?}"
    );
}

/// Each admin page: a tenant gets the 403 page, an admin the page with the console's headers.
pub async fn assert_admin_only(admin: &Console, tenant: &Console, path: &str) {
    let page = admin.get(path).await;
    assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.html);
    assert_secure_headers(&page);
    let refused = tenant.get(path).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{path} as a tenant");
}

fn id(r: &Value) -> String {
    r["id"].as_str().expect("id").to_owned()
}

/// The `<tr>` of the row carrying `attr` (up to its end).
pub fn row<'a>(html: &'a str, attr: &str) -> &'a str {
    let at = html
        .find(attr)
        .unwrap_or_else(|| panic!("no row {attr} in the page"));
    let end = html[at..].find("</tr>").map_or(html.len(), |e| at + e);
    &html[at..end]
}

async fn the_fleet_page_shows_gpus_the_queue_and_nodes_out_of_service(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_sim_gpus("1xA100")
        .start()
        .await;
    app.wait_nodes_ready().await;
    let (admin, _) = login_as(&app, "q1", "admin").await;
    let (tenant_browser, _) = login_as(&app, "q2", "tenant").await;
    let tenant = app.tenant("tina", "100").await;
    let (status, r) = tenant
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let running = id(&r);
    app.wait_status(&tenant.client, &running, "running").await;
    // More than the fleet has: it waits in the queue.
    let (status, r) = tenant
        .client
        .reserve(json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 1, "queue": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let queued = id(&r);
    assert_eq!(r["status"], "pending");
    // The A100 node taken out of service.
    let (status, r) = app
        .admin()
        .post("/api/v1/nodes/node-1/cordon", &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");

    let page = admin.get("/admin").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    let html = &page.html;
    assert!(html.contains("id=\"fleet\" data-live=\"2000\""), "{html}");
    let rtx = row(html, "data-gpu-type=\"RTX4090\"");
    assert!(rtx.contains("data-field=\"allocated\">1<"), "{rtx}");
    assert!(rtx.contains("data-field=\"free\">1<"), "{rtx}");
    assert!(
        rtx.contains("data-field=\"queued\">1<"),
        "/metrics' queue length: {rtx}"
    );
    let a100 = row(html, "data-gpu-type=\"A100\"");
    assert!(
        a100.contains("data-field=\"free\">0<"),
        "a cordoned node's GPU is not free: {a100}"
    );
    let queue = row(html, &format!("data-reservation-id=\"{queued}\""));
    assert!(queue.contains(&tenant.id), "{queue}");
    assert!(
        !html.contains(&format!("data-reservation-id=\"{running}\"")),
        "a placed reservation is not in the queue"
    );
    let out = row(html, "data-node=\"node-1\"");
    assert!(out.contains("data-status=\"draining\""), "{out}");
    assert!(!html.contains("data-node=\"node-0\""), "node-0 is ready");
    // Today's revenue is the daily report's.
    let (status, day) = app
        .admin()
        .get(&format!(
            "/api/v1/reports/daily?date={}",
            chrono::Utc::now().format("%Y-%m-%d")
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{day}");
    let revenue = day["totals"]["revenue"].as_str().unwrap();
    let shown = &html[html.find("data-field=\"revenue\"").expect("revenue")..];
    assert!(
        shown.contains(&format!("{revenue} USD")),
        "revenue {revenue} in {shown}"
    );
    for link in [
        "/admin/users",
        "/admin/reservations",
        "/admin/events",
        "/admin/audit",
        "/admin/reports",
        "/admin/ledger",
    ] {
        assert!(html.contains(&format!("href=\"{link}\"")), "link {link}");
    }
    // As `console.js` refreshes the live part: the first reservation stopped, the queued one
    // takes both GPUs and leaves the queue.
    let (status, r) = tenant
        .client
        .post(&format!("/api/v1/reservations/{running}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    app.wait_status(&tenant.client, &queued, "running").await;
    let live = admin.get_with("/admin", &[("x-gpurent-live", "1")]).await;
    assert_eq!(live.status, StatusCode::OK);
    let rtx = row(&live.html, "data-gpu-type=\"RTX4090\"");
    assert!(rtx.contains("data-field=\"allocated\">2<"), "{rtx}");
    assert!(rtx.contains("data-field=\"free\">0<"), "{rtx}");
    assert!(rtx.contains("data-field=\"queued\">0<"), "{rtx}");
    assert!(
        !live
            .html
            .contains(&format!("data-reservation-id=\"{queued}\"")),
        "placed, it left the queue"
    );
    assert_admin_only(&admin, &tenant_browser, "/admin").await;
    assert_chinese(&admin, "/admin").await;
    app.shutdown().await;
}

both_stores!(
    fleet_test,
    the_fleet_page_shows_gpus_the_queue_and_nodes_out_of_service
);

async fn users_are_created_credited_and_capped_from_the_console(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (admin, _) = login_as(&app, "q1", "admin").await;
    let (tenant_browser, _) = login_as(&app, "q2", "tenant").await;

    // Created: the token is on the answering page, once, in no URL.
    let form = admin.get("/admin/users").await;
    assert_eq!(form.status, StatusCode::OK);
    let key = field_value(&form.html, "idempotency_key").expect("the create form's key");
    let fields = [
        ("name", "hilda"),
        ("role", "host"),
        ("credit", "5.50"),
        ("idempotency_key", key.as_str()),
    ];
    let created = admin.post("/admin/users", &fields).await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.html);
    assert!(
        created.location().is_none(),
        "the token is never in a redirect"
    );
    let token = {
        let at = created
            .html
            .find("data-field=\"token\">")
            .expect("the token")
            + 19;
        created.html[at..at + created.html[at..].find('<').unwrap()].to_owned()
    };
    assert!(token.starts_with("gpr_"), "{token}");
    let hilda = app.client(Some(&token));
    let (status, balance) = hilda.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::OK, "the shown token works: {balance}");
    assert_eq!(balance["balance"], "5.50");
    let listed = admin.get("/admin/users").await;
    assert!(
        !listed.html.contains(&token),
        "the token is shown only once"
    );
    // The same form posted again (a reload) creates nobody else.
    let again = admin.post("/admin/users", &fields).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.html);
    let (_, users) = app.admin().get("/api/v1/users").await;
    let hildas: Vec<&Value> = users
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["name"] == "hilda")
        .collect();
    assert_eq!(hildas.len(), 1, "{users}");
    let hilda_id = hildas[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(hildas[0]["role"], "host");
    // A bad name is refused with the API's reason, on the page.
    let bad = admin
        .post("/admin/users", &[("name", "no spaces"), ("role", "tenant")])
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.html);
    assert!(bad.html.contains("role=\"alert\""), "{}", bad.html);

    // Credit: granted once per form, shown in the list.
    let list = admin.get("/admin/users").await;
    let row_html = row(&list.html, &format!("data-user-id=\"{hilda_id}\""));
    let credit_key = field_value(row_html, "idempotency_key").expect("the credit form's key");
    let path = format!("/admin/users/{hilda_id}/credit");
    let grant = [("amount", "10"), ("idempotency_key", credit_key.as_str())];
    for _ in 0..2 {
        let granted = admin.post(&path, &grant).await;
        assert_eq!(granted.status, StatusCode::SEE_OTHER, "{}", granted.html);
        assert!(granted
            .location()
            .unwrap()
            .starts_with("/admin/users?done=credit"));
    }
    let (_, balance) = hilda.get("/api/v1/balance").await;
    assert_eq!(balance["balance"], "15.50", "granted once for one form");
    let list = admin.get("/admin/users").await;
    assert!(row(&list.html, &format!("data-user-id=\"{hilda_id}\"")).contains("15.50"));
    let bad = admin.post(&path, &[("amount", "lots")]).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.html);

    // Caps.
    let path = format!("/admin/users/{hilda_id}/limits");
    let set = admin
        .post(
            &path,
            &[("max_reservations", "3"), ("max_spend_per_hour", "2.50")],
        )
        .await;
    assert_eq!(set.status, StatusCode::SEE_OTHER, "{}", set.html);
    let (_, user) = app.admin().get(&format!("/api/v1/users/{hilda_id}")).await;
    assert_eq!(user["max_reservations"], 3, "{user}");
    assert_eq!(user["max_spend_per_hour"], "2.50", "{user}");
    let list = admin.get("/admin/users?done=limits&user=x").await;
    assert!(list.html.contains("alert ok"), "the notice");

    // Without the CSRF token, or as a tenant, nothing happens.
    let forged = admin
        .post_raw(&path, &[("max_reservations", "9")], &[])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let forged = tenant_browser
        .post(
            &format!("/admin/users/{hilda_id}/credit"),
            &[("amount", "99")],
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let (_, user) = app.admin().get(&format!("/api/v1/users/{hilda_id}")).await;
    assert_eq!(user["max_reservations"], 3);
    assert_eq!(user["balance"], "15.50");

    assert_admin_only(&admin, &tenant_browser, "/admin/users").await;
    assert_chinese(&admin, "/admin/users").await;
    // The answering page of a creation too.
    let zh = admin
        .post(
            "/admin/users?lang=zh-CN",
            &[("name", "ivy"), ("role", "tenant")],
        )
        .await;
    assert_eq!(zh.status, StatusCode::OK, "{}", zh.html);
    let words = untranslated(&zh.html);
    assert!(words.is_empty(), "untranslated: {words:?}");
    app.shutdown().await;
}

both_stores!(
    users_test,
    users_are_created_credited_and_capped_from_the_console
);

async fn everyones_reservations_are_filtered_and_paged(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("4xRTX4090")
        .start()
        .await;
    app.wait_nodes_ready().await;
    let (admin, _) = login_as(&app, "q1", "admin").await;
    let (tenant_browser, _) = login_as(&app, "q2", "tenant").await;
    let alice = app.tenant("alice", "100").await;
    let bob = app.tenant("bob", "100").await;
    let mut ids = Vec::new();
    for who in [&alice, &bob, &alice] {
        let (status, r) = who
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        ids.push(id(&r));
    }
    app.wait_status(&alice.client, &ids[0], "running").await;
    let (status, r) = alice
        .client
        .post(&format!("/api/v1/reservations/{}/stop", ids[0]), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    app.wait_status(&alice.client, &ids[0], "stopped").await;

    let all = admin.get("/admin/reservations").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.html);
    for id in &ids {
        assert!(
            all.html.contains(&format!("href=\"/instances/{id}\"")),
            "{id}"
        );
    }
    assert!(
        all.html.contains("data-field=\"filtered\""),
        "the page says it filters"
    );
    let by_tenant = admin
        .get(&format!("/admin/reservations?tenant={}", bob.id))
        .await;
    assert!(by_tenant
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[1])));
    assert!(!by_tenant
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[0])));
    assert!(!by_tenant
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[2])));
    let stopped = admin.get("/admin/reservations?status=stopped").await;
    assert!(stopped
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[0])));
    assert!(!stopped
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[2])));
    let by_node = admin
        .get("/admin/reservations?node=node-0&gpu_type=RTX+4090")
        .await;
    for id in &ids {
        assert!(
            by_node
                .html
                .contains(&format!("data-reservation-id=\"{id}\"")),
            "{id}"
        );
    }
    let none = admin.get("/admin/reservations?gpu_type=A100").await;
    assert!(
        !none.html.contains("data-reservation-id="),
        "no A100 reservations"
    );

    // Pages of two, newest first, by the API's cursor with the filters kept.
    let first = admin.get("/admin/reservations?limit=2").await;
    assert!(first
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[2])));
    assert!(!first
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[0])));
    let next = {
        let at = first
            .html
            .find("data-action=\"next-page\"")
            .expect("a next page");
        let tag = &first.html[first.html[..at].rfind('<').unwrap()..at];
        let href = tag.find("href=\"").unwrap() + 6;
        tag[href..href + tag[href..].find('"').unwrap()].replace("&amp;", "&")
    };
    assert!(next.contains("limit=2"), "{next}");
    let second = admin.get(&next).await;
    assert_eq!(second.status, StatusCode::OK, "{next}: {}", second.html);
    assert!(second
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[0])));
    assert!(!second
        .html
        .contains(&format!("data-reservation-id=\"{}\"", ids[2])));

    // The admin opens anyone's instance; a tenant not another's.
    let page = admin.get(&format!("/instances/{}", ids[1])).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        tenant_browser
            .get(&format!("/instances/{}", ids[1]))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_admin_only(&admin, &tenant_browser, "/admin/reservations").await;
    assert_chinese(&admin, "/admin/reservations").await;
    app.shutdown().await;
}

both_stores!(
    reservations_test,
    everyones_reservations_are_filtered_and_paged
);

async fn events_are_listed_a_page_at_a_time(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (admin, _) = login_as(&app, "q1", "admin").await;
    let (tenant_browser, _) = login_as(&app, "q2", "tenant").await;
    let empty = admin.get("/admin/events").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert!(!empty.html.contains("data-event-id="));
    // 105 health events, as the health rules write them.
    for i in 0..105 {
        app.raw_sql(&format!(
            "INSERT INTO events (at, node_id, kind, detail) VALUES ({}, 'node-x', '{}', 'GPU 0 at {} C')",
            1_700_000_000_000_000_i64 + i,
            if i % 2 == 0 { "node_unhealthy" } else { "node_healthy" },
            80 + i
        ))
        .await;
    }
    let (_, api) = app.admin().get("/api/v1/events?limit=100").await;
    let api = api.as_array().unwrap();
    let first = admin.get("/admin/events").await;
    assert_eq!(first.html.matches("data-event-id=").count(), 100);
    for e in [&api[0], &api[99]] {
        let tr = row(&first.html, &format!("data-event-id=\"{}\"", e["id"]));
        assert!(tr.contains(e["detail"].as_str().unwrap()), "{tr}");
        assert!(tr.contains(e["kind"].as_str().unwrap()), "{tr}");
    }
    let last = api[99]["id"].as_i64().unwrap();
    assert!(first
        .html
        .contains(&format!("href=\"/admin/events?after={last}\"")));
    let second = admin.get(&format!("/admin/events?after={last}")).await;
    assert_eq!(second.html.matches("data-event-id=").count(), 5);
    assert!(!second.html.contains("data-action=\"next-page\""));
    assert_admin_only(&admin, &tenant_browser, "/admin/events").await;
    assert_chinese(&admin, "/admin/events").await;
    app.shutdown().await;
}

both_stores!(events_test, events_are_listed_a_page_at_a_time);

/// The content type of an answer.
pub fn content_type(page: &Page) -> &str {
    page.headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}
