//! Hostile input to `/login` and to a reservation's command: every `next=` (control
//! characters raw or percent-encoded, other hosts, backslashes, schemes) leads to `/` or a
//! path of this site and never to a 5xx, whatever the form body; an empty program is a 422,
//! and the console's reserve form refuses invalid UTF-8 as the API does.

use gpurent_store::Backend;
use reqwest::header::{CONTENT_TYPE, COOKIE};
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::{field_value, login, no_redirects, PASSWORD};

/// `next` values as they appear in a URL's query (already percent-encoded where they are).
const HOSTILE_QUERIES: &[&str] = &[
    "/%0a/x",
    "/%0d%0aSet-Cookie:%20x=1",
    "/%09/example.com",
    "%09/example.com",
    "/%00",
    "/%7F",
    "//evil.example",
    "%2F%2Fevil.example",
    "/%2F/evil.example",
    "/%5Cevil.example",
    "%5C%5Cevil.example",
    "https://evil.example/",
    "https:%2F%2Fevil.example",
    "javascript:alert(1)",
    "/%E9",
    "/%ZZ",
    "",
    "instances",
    "/instances&next=//evil.example",
];

/// The same as a form posts them: raw.
const HOSTILE_FIELDS: &[&str] = &[
    "/\n/x",
    "/\r\nSet-Cookie: x=1",
    "/\t/example.com",
    "\t/example.com",
    "/\0",
    "//evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "https://evil.example/",
    "javascript:alert(1)",
    "/caf\u{e9}",
    "",
];

/// A `Location` or `next` the browser reads as a path of this site.
fn local(to: &str) -> bool {
    to.starts_with('/')
        && !to.starts_with("//")
        && !to.contains('\\')
        && to.bytes().all(|b| b.is_ascii_graphic())
        && !to.to_ascii_lowercase().contains("%0")
        && !to.to_ascii_lowercase().contains("%5c")
}

async fn every_next_is_a_local_path(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let http = no_redirects();
    // Not logged in: the form, with a local `next` in it.
    for next in HOSTILE_QUERIES {
        let answer = http
            .get(format!("{}/login?next={next}", app.base))
            .send()
            .await
            .unwrap();
        let status = answer.status();
        assert!(!status.is_server_error(), "next={next:?}: {status}");
        if status == StatusCode::OK {
            let html = answer.text().await.unwrap();
            let kept = field_value(&html, "next").expect("a next field");
            assert!(local(&kept), "next={next:?} kept as {kept:?}");
        }
    }
    // Logged in: a redirect to `/` or a local path.
    let tina = app.tenant("tina", "10").await;
    let console = login(&app, &tina, "tina").await;
    for next in HOSTILE_QUERIES {
        let page = console.get(&format!("/login?next={next}")).await;
        assert!(
            !page.status.is_server_error(),
            "next={next:?}: {}",
            page.status
        );
        if page.status.is_redirection() {
            let to = page.location().unwrap_or("");
            assert!(local(to), "next={next:?} led to {to:?}");
        }
    }
    assert_eq!(
        console.get("/login?next=/%0a/x").await.location(),
        Some("/")
    );
    assert_eq!(
        console.get("/login?next=/%09/example.com").await.location(),
        Some("/")
    );
    assert_eq!(
        console.get("/login?next=/instances").await.location(),
        Some("/instances")
    );

    // The login form posted with each: the session, and a local redirect.
    for next in HOSTILE_FIELDS {
        let form = http
            .get(format!("{}/login", app.base))
            .send()
            .await
            .unwrap();
        let cookie = form
            .headers()
            .get_all("set-cookie")
            .iter()
            .find_map(|v| {
                let v = v.to_str().ok()?;
                v.strip_prefix("gpurent_login=")
                    .map(|rest| rest.split(';').next().unwrap_or("").to_owned())
            })
            .expect("a login cookie");
        let csrf = field_value(&form.text().await.unwrap(), "_csrf").unwrap();
        let answer = http
            .post(format!("{}/login", app.base))
            .header(COOKIE, format!("gpurent_login={cookie}"))
            .form(&[
                ("username", "tina"),
                ("password", PASSWORD),
                ("_csrf", &csrf),
                ("next", next),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "next={next:?}");
        let to = answer.headers()["location"].to_str().unwrap();
        assert!(local(to), "next={next:?} led to {to:?}");
    }

    // Whatever the body: never a 5xx.
    let bodies: &[(&str, &[u8])] = &[
        (
            "application/x-www-form-urlencoded",
            b"username=%FF%FE&password=\xff&next=/%0a",
        ),
        (
            "application/x-www-form-urlencoded",
            b"next=/&next=//x&_csrf=a&_csrf=b",
        ),
        ("application/x-www-form-urlencoded", b"%%%&&&==="),
        ("application/x-www-form-urlencoded", b""),
        ("application/json", b"{\"username\":\"tina\"}"),
        ("text/plain", b"\x00\x01\x02"),
    ];
    for (kind, body) in bodies {
        let answer = http
            .post(format!("{}/login?next=/%0a/x", app.base))
            .header(CONTENT_TYPE, *kind)
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert!(
            !answer.status().is_server_error(),
            "{kind} {body:?}: {}",
            answer.status()
        );
    }
    app.shutdown().await;
}
both_stores!(login_next, every_next_is_a_local_path);

async fn an_empty_program_and_invalid_utf8_are_refused(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let tina = app.tenant("tina", "100").await;
    for command in [json!([""]), json!(["  "]), json!(["", "python"])] {
        let (status, body) = tina
            .client
            .post(
                "/api/v1/reservations",
                &json!({"gpu_type": "rtx4090", "gpu_count": 1, "hours": 1, "command": command}),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{command}: {body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("command[0]"),
            "{body}"
        );
    }

    // The console's reserve form: invalid UTF-8 in the command is refused, not run as U+FFFD.
    let console = login(&app, &tina, "tina").await;
    let mut body = format!(
        "_csrf={}&gpu_type=rtx4090&gpu_count=1&hours=1&command=python+",
        console.csrf
    )
    .into_bytes();
    body.extend_from_slice(b"%FF%FEx");
    let answer = no_redirects()
        .post(format!("{}/offers", app.base))
        .header(COOKIE, format!("gpurent_session={}", console.cookie))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let html = answer.text().await.unwrap();
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{html}");
    assert!(html.contains("not valid UTF-8"), "{html}");
    let (_, mine) = tina.client.get("/api/v1/reservations").await;
    assert_eq!(mine.as_array().unwrap().len(), 0, "{mine}");
    app.shutdown().await;
}
both_stores!(reserve_input, an_empty_program_and_invalid_utf8_are_refused);
