//! The instance page's web terminal (xterm.js over a WebSocket to the relay `gpurent ssh`
//! uses), in a real Chromium: a command typed into it runs in the instance and its output is
//! drawn in the terminal, 24-bit colours too, under a CSP without `'unsafe-inline'` that
//! nothing on the page violates. The process executor always, on an interactive instance
//! reserved through the console's form with no command; the Docker executor where a Docker
//! Engine with the test image answers.

use std::cell::OnceCell;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::key::Key;
use serde_json::json;

use crate::browser::{self, Browser, Lang};
use crate::console_support::{check_page, Console, SHOWN};
use crate::ssh_support::docker_answers;

/// Removes a reservation's containers when dropped: a killed agent leaves them running.
/// Made before the agent starts, so it is dropped after the agent is gone.
struct Containers(OnceCell<String>);

impl Drop for Containers {
    fn drop(&mut self) {
        let Some(id) = self.0.get() else {
            return;
        };
        let label = format!(
            "label={}={id}",
            gpurent_agent::executor::docker::LABEL_RESERVATION
        );
        let Ok(listed) = Command::new("docker")
            .args(["ps", "-aq", "--filter", &label])
            .output()
        else {
            return;
        };
        for container in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
            let _ = Command::new("docker")
                .args(["rm", "-f", container])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Reserves one GPU for an hour through the console's form with the command left empty (an
/// interactive instance), and waits on its page until it runs; its id.
fn reserve_interactive_in_the_form(console: &Console, browser: &Browser, token: &str) -> String {
    browser.goto(&console.page("/offers"));
    let form = "form[data-form=\"reserve\"]";
    browser.find(form);
    browser.fill("gpu_type", "RTX4090");
    browser.fill("gpu_count", "1");
    browser.fill("hours", "1");
    browser.click(&format!("{form} [type=\"submit\"]"));
    let path = browser.wait_for_path("/instances/ID", SHOWN, |p| {
        p.strip_prefix("/instances/")
            .is_some_and(|id| !id.is_empty())
    });
    let id = path.trim_start_matches("/instances/").to_owned();
    assert_eq!(console.cluster.get(token, &id)["command"], json!([]));
    browser.wait_for_text(
        "[data-field=\"status\"]",
        "running",
        Duration::from_secs(60),
    );
    id
}

/// Types a command into the terminal of a running instance's page and waits for its output.
/// `reserve`: the CLI's arguments, or None for the console's form with no command.
fn a_command_runs_in_the_web_terminal(executor: &str, reserve: Option<&[&str]>) {
    let containers = Containers(OnceCell::new());
    let console = Console::with(1, executor);
    let ada = console.user("ada", "tenant");
    let browser = Browser::start(Lang::En);
    console.login(&browser, &ada);
    let id = match reserve {
        Some(args) => console.running(&ada, args),
        None => reserve_interactive_in_the_form(&console, &browser, &ada.token),
    };
    if executor == "docker" {
        let _ = containers.0.set(id.clone());
    }
    browser.goto(&console.page(&format!("/instances/{id}")));
    let terminal = "[data-field=\"terminal\"]";
    // A page may keep the terminal behind a button until it is wanted.
    if !browser.find_all("[data-action=\"terminal\"]").is_empty() {
        browser.click("[data-action=\"terminal\"]");
    }
    browser.find(&format!("{terminal} .xterm"));
    // xterm.js reads keys from its helper textarea; the shell's prompt comes first.
    let input = format!("{terminal} textarea");
    browser.click(terminal);
    browser.wait_for_text_where(terminal, "a shell prompt", SHOWN, |t| {
        t.contains('$') || t.contains('#')
    });
    // The output, not the echo of what was typed: only the shell makes 42 of 6*7.
    browser.type_into(
        &input,
        &format!("echo hello-$((6*7)){}", char::from(Key::Enter)),
    );
    browser.wait_for_text(terminal, "hello-42", Duration::from_secs(30));
    // 24-bit colours: xterm.js sets them with setAttribute("style"), which the CSP refuses;
    // terminal.js sends them through the CSSOM.
    browser.type_into(
        &input,
        &format!(
            "printf '\\033[38;2;255;0;0;48;2;0;0;255m%s\\033[0m\\n' truecolour{}",
            char::from(Key::Enter)
        ),
    );
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let colours = browser.execute(TRUECOLOUR, vec![]);
        if colours == json!(["rgb(255, 0, 0)", "rgb(0, 0, 255)"]) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the 24-bit colours are not drawn: {colours}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // xterm.js's own `<style>` elements have the page's nonce and are applied.
    let styles = browser.execute(STYLES, vec![]);
    assert!(
        styles["count"].as_u64().unwrap_or(0) > 0 && styles["applied"] == styles["count"],
        "xterm.js's <style> elements: {styles}"
    );
    assert_eq!(
        browser.execute("return Array.isArray(window.__cspViolations);", vec![]),
        json!(true),
        "the page records its CSP violations"
    );
    let violations = browser.csp_violations();
    assert!(violations.is_empty(), "the terminal's page: {violations:?}");
    check_page(&browser, &format!("instance-terminal-{executor}"));
}

/// The foreground and background drawn for the span of the word `truecolour` printed alone.
const TRUECOLOUR: &str =
    "var spans = document.querySelectorAll('[data-field=\"terminal\"] .xterm-rows span');\
for (var i = 0; i < spans.length; i++) {\
  if (spans[i].textContent === 'truecolour') {\
    var s = getComputedStyle(spans[i]);\
    return [s.color, s.backgroundColor];\
  }\
}\
return null;";

/// How many `<style>` elements the page has, and how many of them apply (their sheet exists).
const STYLES: &str = "var all = document.querySelectorAll('style');\
var applied = 0;\
for (var i = 0; i < all.length; i++) { if (all[i].sheet) { applied++; } }\
return { count: all.length, applied: applied };";

#[test]
fn console_web_terminal_runs_a_command_in_a_process_instance() {
    if !browser::available() {
        return;
    }
    // An interactive instance, reserved through the form with no command (issue 33).
    a_command_runs_in_the_web_terminal("process", None);
}

#[test]
fn console_web_terminal_runs_a_command_in_a_docker_instance() {
    if !browser::available() {
        return;
    }
    if !docker_answers() {
        if std::env::var("GPURENT_TEST_DOCKER").as_deref() == Ok("1") {
            panic!("GPURENT_TEST_DOCKER=1 but no Docker Engine answers with the test image");
        }
        eprintln!("SKIPPED: no Docker Engine with the test image");
        return;
    }
    a_command_runs_in_the_web_terminal(
        "docker",
        Some(&[
            "--image",
            "gpurent-test/busybox:latest",
            "--",
            "sleep",
            "600",
        ]),
    );
}
