//! Issue 31's critical finding in a real Chromium: a tenant publishes a port whose page carries
//! an inline script that tries what the adversarial test did (read `_csrf` from `/account`,
//! add the attacker's SSH key, set a new password), and sends its `gpurent open` link to a
//! logged-in admin. The link does nothing in the admin's browser; and even the app itself,
//! opened in that browser on the apps' site, runs but reaches nothing of the console. The
//! admin's keys, tokens, password and session are unchanged.

use std::io::{Read, Write};
use std::time::Duration;

use crate::browser::{self, Browser, Lang};
use crate::console_support::{Console, Http, SHOWN};

const PORT: &str = "18003";
const ATTACKER_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFkv1fDBCmZ1VxJ0fP4M9V0x4g8Jm4RkS3aW1b6yYc2t bert@evil";

/// The hostile app: one page whose inline script tries the takeover on the origin it is
/// served from and on the console's, and writes what it got into `#log` and the title.
fn hostile_app(console_url: &str) -> String {
    let page = format!(
        r#"<!doctype html><html><head><title>loading</title></head><body><pre id="log"></pre>
<script>
const log = [];
async function attack(base) {{
  try {{
    const r = await fetch(base + "/account", {{ credentials: "include" }});
    const html = await r.text();
    const m = html.match(/name="_csrf" value="([0-9a-f]+)"/);
    log.push(`${{base || "here"}} account ${{r.status}} csrf=${{m ? "yes" : "no"}}`);
    if (!m) return;
    const key = new URLSearchParams({{ _csrf: m[1], name: "bert", public_key: "{ATTACKER_KEY}" }});
    const k = await fetch(base + "/account/ssh-keys", {{ method: "POST", body: key, credentials: "include" }});
    log.push(`key ${{k.status}}`);
    const pw = new URLSearchParams({{ _csrf: m[1], password: "owned-by-bert-1", repeat: "owned-by-bert-1" }});
    const p = await fetch(base + "/account/password", {{ method: "POST", body: pw, credentials: "include" }});
    log.push(`password ${{p.status}}`);
  }} catch (e) {{
    log.push(`${{base || "here"}} refused: ${{e}}`);
  }}
}}
(async () => {{
  await attack("");
  await attack("{console_url}");
  document.getElementById("log").textContent = log.join("\n");
  document.title = "ran";
}})();
</script></body></html>"#
    );
    // The page at every path that ends in `/` (the app's root on the apps' site, and
    // `/proxy/ID/PORT/` on the path form); a 404 elsewhere (`/account` on the app's own site).
    let server = format!(
        "import http.server as h\n\
         page = open('index.html', 'rb').read()\n\
         class App(h.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       ok = self.path.split('?')[0].endswith('/')\n\
         \x20       self.send_response(200 if ok else 404)\n\
         \x20       self.send_header('content-type', 'text/html')\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(page if ok else b'not here')\n\
         h.HTTPServer(('127.0.0.1', {PORT}), App).serve_forever()\n"
    );
    format!(
        "d=$(mktemp -d) && cd \"$d\" && cat > index.html <<'PAGE'\n{page}\nPAGE\ncat > app.py <<'APP'\n{server}APP\nexec python3 app.py"
    )
}

/// GET `path` with the bearer `token`: the whole answer.
fn get_with_token(url: &str, path: &str, token: &str) -> String {
    let addr = url.trim_start_matches("http://");
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn a_tenants_app_cannot_take_over_whoever_opens_its_link() {
    if !browser::available() {
        return;
    }
    let console = Console::start();
    let bert = console.user("bert", "tenant");
    let admin = console.admin();
    let script = hostile_app(&console.url);
    let id = console.running(&bert, &["--http-port", PORT, "--", "sh", "-c", &script]);
    let mut last = String::new();
    for _ in 0..600 {
        last = get_with_token(&console.url, &format!("/proxy/{id}/{PORT}/"), &bert.token);
        if last.contains("attack(base)") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !last.contains("attack(base)") {
        let logs = console
            .cluster
            .cli(Some(&bert.token), false, &["logs", &id])
            .stdout;
        let tail = &logs[logs.len().saturating_sub(2000)..];
        panic!("the hostile app does not answer through the proxy: {last}\nits log: {tail}");
    }

    let keys = |token: &str| {
        console
            .cluster
            .cli(Some(token), true, &["keys", "ls"])
            .json()
    };
    // The admin's own tokens (an admin lists everyone's).
    let tokens = || -> Vec<serde_json::Value> {
        let all = console
            .cluster
            .cli(Some(&admin.token), true, &["tokens", "ls"])
            .json();
        all.as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["user_id"] == admin.id.as_str())
            .cloned()
            .collect()
    };

    // The admin, logged in, opens bert's link: a page that says whose app it is.
    let browser = Browser::start(Lang::En);
    console.login(&browser, &admin);
    let session = browser.cookie("gpurent_session").expect("a session");
    let keys_before = keys(&admin.token);
    let tokens_before = tokens();
    let open = console
        .cluster
        .cli(Some(&bert.token), false, &["open", &id, PORT]);
    assert_eq!(open.code, 0, "{open:?}");
    let link = open.stdout.trim().to_owned();
    browser.goto(&link);
    let owner = browser.wait_for_text("[data-field=\"owner\"]", "bert", SHOWN);
    assert_eq!(owner, "bert");
    assert!(
        browser.page_text().contains("Nothing was done"),
        "{}",
        browser.page_text()
    );
    assert_eq!(browser.current_url().host_str(), Some("127.0.0.1"));

    // Worse: bert sends the app itself, with a ticket of his own, so the admin's browser
    // runs its script. It runs, on the app's own site, and gets nothing of the console.
    let bert_http = Http::login(&console, &bert);
    let link = console
        .cluster
        .cli(Some(&bert.token), false, &["open", &id, PORT]);
    let path = link
        .stdout
        .trim()
        .trim_start_matches(&console.url)
        .to_owned();
    let answer = bert_http.get(&path);
    assert_eq!(answer.status, 303, "{}", answer.body);
    let app = answer.location.expect("to the app");
    assert!(app.contains(&format!("{id}-{PORT}.localhost:")), "{app}");
    browser.goto(&app);
    let deadline = std::time::Instant::now() + SHOWN;
    while browser.execute("return document.title;", vec![]) != "ran" {
        assert!(
            std::time::Instant::now() < deadline,
            "the app's script did not finish: {}",
            browser.page_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = browser.text("#log");
    assert!(log.contains("here account 404 csrf=no"), "{log}");
    assert!(
        log.contains("refused"),
        "the console answered the app: {log}"
    );
    assert!(!log.contains("csrf=yes"), "{log}");
    assert!(
        browser
            .current_url()
            .host_str()
            .is_some_and(|h| h.ends_with(".localhost")),
        "{}",
        browser.current_url()
    );

    // Nothing of the admin's changed: keys, tokens, password, and the session still works.
    assert_eq!(keys(&admin.token), keys_before);
    assert_eq!(tokens(), tokens_before);
    browser.goto(&console.page("/account"));
    assert_eq!(browser.path(), "/account", "the admin's session ended");
    assert_eq!(browser.cookie("gpurent_session"), Some(session));
    let _still = Http::login(&console, &admin);
    console.cluster.ledger_check();
}
