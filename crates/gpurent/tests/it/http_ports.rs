//! `gpurent reserve --http-port` and `gpurent open` against a real `gpurent up`: the ports in
//! the reservation, where `get` says they are (the apps' site for a browser, the path form
//! for a token), a one-time link to the console, and the sim executor's plain 502 (it runs
//! nothing to reach).

use std::io::{Read, Write};

use crate::support::{cli, eventually, read_token, Daemon};

/// One HTTP/1.1 request on a fresh connection: the whole answer as text.
fn http(url: &str, path: &str, header: &str) -> String {
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{header}\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn published_ports_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = Daemon::up_sim(
        &data,
        "1xRTX4090",
        &["--apps-domain", "Apps.Test."],
        &dir.path().join("up.log"),
    );
    let url = up.url.clone();
    let admin = read_token(&data);
    let user = cli(
        &url,
        Some(&admin),
        true,
        &["users", "create", "ida", "--credit", "20"],
    );
    let token = user.json()["token"].as_str().unwrap().to_owned();
    let t = Some(token.as_str());

    let twice = cli(
        &url,
        t,
        true,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--http-port",
            "8888",
            "--http-port",
            "8888",
        ],
    );
    assert_ne!(twice.code, 0);
    assert!(twice.stdout.contains("8888 is given twice"), "{twice:?}");

    let r = cli(
        &url,
        t,
        true,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--http-port",
            "8888",
            "--http-port",
            "6006",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let r = r.json();
    assert_eq!(r["http_ports"], serde_json::json!([8888, 6006]));
    let id = r["id"].as_str().unwrap().to_owned();
    eventually("the reservation to run", 30, || {
        cli(&url, t, true, &["get", &id]).json()["status"] == "running"
    });
    let got = cli(&url, t, true, &["get", &id]).json();
    let host = url.trim_start_matches("http://");
    assert_eq!(
        got["http"][0]["url"],
        format!("http://{host}/proxy/{id}/8888/")
    );
    let listener_port = up.url.rsplit(':').next().unwrap().to_owned();
    assert_eq!(
        got["http"][0]["app_url"],
        format!("http://{id}-8888.apps.test:{listener_port}/")
    );
    let table = cli(&url, t, false, &["get", &id]);
    assert!(
        table.stdout.contains(&format!(
            "http 6006: http://{id}-6006.apps.test:{listener_port}/ (browser: gpurent open {id} 6006; with a token: http://{host}/proxy/{id}/6006/)"
        )),
        "{table:?}"
    );

    // `open` prints a link to the console, which only the owner's console session turns
    // into the app (the server suite follows it through); without one, the login page.
    let open = cli(&url, t, false, &["open", &id, "8888"]);
    assert_eq!(open.code, 0, "{open:?}");
    let link = open.stdout.trim().to_owned();
    let prefix = format!("http://{host}/open/gpl_");
    assert!(link.starts_with(&prefix), "{link}");
    let path = link.trim_start_matches(&format!("http://{host}"));
    let first = http(&url, path, "");
    assert!(first.starts_with("HTTP/1.1 303"), "{first}");
    assert!(
        first.contains("location: /login?next=%2Fopen%2Fgpl_"),
        "{first}"
    );
    assert!(!first.contains("set-cookie: gpurent_proxy"), "{first}");
    let with_json = cli(&url, t, true, &["open", &id, "6006"]).json();
    assert!(with_json["expires_at"].is_string(), "{with_json}");
    assert_eq!(
        with_json["app_url"],
        format!("http://{id}-6006.apps.test:{listener_port}/"),
        "{with_json}"
    );

    // The sim executor runs nothing: a 502 that says so, not a hang.
    let bad = http(
        &url,
        &format!("/proxy/{id}/8888/"),
        &format!("Authorization: Bearer {token}\r\n"),
    );
    assert!(bad.starts_with("HTTP/1.1 502"), "{bad}");
    assert!(
        bad.contains("cannot reach port 8888 of reservation"),
        "{bad}"
    );

    // A port it does not publish: refused, saying which it does.
    let other = cli(&url, t, true, &["open", &id, "7777"]);
    assert_ne!(other.code, 0);
    assert!(
        other.stdout.contains("it publishes: 8888, 6006"),
        "{other:?}"
    );
    assert!(up.terminate().success());
}

#[test]
fn a_bad_apps_domain_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(crate::support::BIN)
        .args(["server", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--apps-domain", "*.apps.test"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--apps-domain") && stderr.contains("not a DNS name"),
        "{stderr}"
    );
}
