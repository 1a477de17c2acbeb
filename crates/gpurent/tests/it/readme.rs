//! The README's two commands and its tour, run as written.
//!
//! The README's "Run it" block must be `cargo run --release -- up` and its "Test it" block the
//! command `.ci/run` runs. The tour ("A tour") is run line by line against a `gpurent up`
//! started in a fresh directory as the run command says, the test binary standing in for
//! `cargo run --release --` (in the run command and in the tour's `gpurent` function). What
//! the test changes, and only that: the ports (`up` on free loopback ports, its URL for the
//! README's `http://127.0.0.1:8080`), free disk (`--min-disk-free-gb 0`: a test machine's
//! temporary directory is not a GPU host's disk), and the placeholders the README shows
//! (`gpr_...`: the token `users create` printed; `<id>`: the reservation id `reserve`
//! printed). Each line must exit 0 and print every "quoted" fragment of its comment (`...`
//! stands for anything); a line that reads (`logs`, `ssh`, ...) is tried again until it does,
//! as a reader would. A line naming the console's URL is checked in the console: the URL
//! answers with the login page, and the tour's user logs in with the tour's password and sees
//! the tour's reservation.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::ssh_support::{keygen, run_bounded, Guard};
use crate::support::{cli, eventually, Daemon, Run, BIN};

const README: &str = include_str!("../../../../README.md");
const CI_RUN: &str = include_str!("../../../../.ci/run");

/// The README's console URL, the default `--listen` of `up`.
const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// What the test binary stands in for.
const CARGO_RUN: &str = "cargo run --release --";
const CARGO_RUN_QUIET: &str = "cargo run --release -q --";

/// Tour commands that only read: tried again until they print what the README says.
const READS: [&str; 7] = ["logs", "ssh", "get", "ls", "offers", "balance", "nodes"];

/// The lines of the first ```sh block under the heading `heading`.
fn sh_block(heading: &str) -> Vec<String> {
    let mut lines = README.lines().skip_while(|l| l.trim() != heading);
    assert!(
        lines.next().is_some(),
        "the README has no heading {heading:?}"
    );
    let block: Vec<String> = lines
        .take_while(|l| !l.starts_with("## "))
        .skip_while(|l| l.trim() != "```sh")
        .skip(1)
        .take_while(|l| l.trim() != "```")
        .map(str::to_owned)
        .collect();
    assert!(
        !block.is_empty(),
        "the README's {heading:?} has no ```sh block"
    );
    block
}

/// One line of the tour: the line, its command, and what its comment says it prints.
#[derive(Debug)]
struct Step {
    line: String,
    command: String,
    expected: Vec<String>,
}

/// Splits `line` at its comment (a `#` after a blank, outside quotes): the command, and every
/// "quoted" fragment of the comment.
fn step(line: &str) -> Step {
    let (mut single, mut double) = (false, false);
    let mut comment_at = None;
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => {
                comment_at = Some(i);
                break;
            }
            _ => {}
        }
        previous = c;
    }
    let (command, comment) = match comment_at {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, ""),
    };
    let expected = comment
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    Step {
        line: line.to_owned(),
        command: command.trim().to_owned(),
        expected,
    }
}

/// The tour's steps, blank and comment-only lines left out.
fn tour() -> Vec<Step> {
    sh_block("## A tour")
        .iter()
        .map(|l| step(l))
        .filter(|s| !s.command.is_empty())
        .collect()
}

/// The `gpurent` subcommand a step runs (`users` for `gpurent users passwd`).
fn subcommand(command: &str) -> Option<&str> {
    let mut words = command.split_whitespace();
    words.find(|w| *w == "gpurent")?;
    words.next()
}

/// Whether `output` holds `fragment`, its `...` standing for anything.
fn shows(output: &str, fragment: &str) -> bool {
    let mut rest = output;
    for part in fragment.split("...").filter(|p| !p.is_empty()) {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// `VAR='value'` (or "value", or bare) in `command`.
fn assigned(command: &str, var: &str) -> Option<String> {
    let rest = command.split(&format!("{var}=")).nth(1)?;
    let value = match rest.chars().next()? {
        q @ ('\'' | '"') => rest[1..].split(q).next()?,
        _ => rest.split_whitespace().next()?,
    };
    Some(value.to_owned())
}

#[test]
fn readme_run_and_test_commands_are_the_ones_ci_and_the_tour_use() {
    assert_eq!(sh_block("## Run it"), [format!("{CARGO_RUN} up")]);
    let test = sh_block("## Test it");
    assert_eq!(test, ["bash scripts/test.sh"], "the README's test command");
    assert!(
        CI_RUN
            .lines()
            .map(|l| l.trim().trim_start_matches("exec "))
            .any(|l| l == test[0]),
        ".ci/run must run the README's test command {:?}:\n{CI_RUN}",
        test[0]
    );
    // The tour must keep showing what the issue asks of it, in order of use.
    let steps = tour();
    assert!(
        steps[0].command.starts_with("gpurent()") && steps[0].command.contains(CARGO_RUN_QUIET),
        "the tour starts by defining `gpurent` as `{CARGO_RUN_QUIET}`: {:?}",
        steps[0]
    );
    let mut at = 0;
    for wanted in [
        "users create",
        "reserve",
        "logs <id>",
        "ssh <id>",
        DEFAULT_URL,
        "stop <id>",
    ] {
        let found = steps[at..].iter().position(|s| s.line.contains(wanted));
        let found = found.unwrap_or_else(|| panic!("the tour has no {wanted:?} after {at}"));
        at += found + 1;
    }
    assert!(
        steps.len() <= 12,
        "a tour of {} lines is no longer short",
        steps.len()
    );
}

/// `/proc/self` belongs to the process's effective user.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A tour in progress: `up`, the reader's home (an SSH key in an ssh-agent) and what the tour's
/// lines printed. Dropped, it stops the tour's reservation and leaves nothing running.
struct Tour {
    dir: tempfile::TempDir,
    home: PathBuf,
    up: Option<Daemon>,
    agent: Option<Guard>,
    socket: PathBuf,
    prelude: String,
    user: Option<String>,
    token: Option<String>,
    id: Option<String>,
}

impl Drop for Tour {
    fn drop(&mut self) {
        if let (Some(up), Some(token), Some(id)) = (&self.up, &self.token, &self.id) {
            let _ = cli(&up.url, Some(token), true, &["stop", id]);
            for _ in 0..100 {
                let got = cli(&up.url, Some(token), true, &["get", id]);
                let status = serde_json::from_str::<serde_json::Value>(&got.stdout)
                    .ok()
                    .and_then(|v| v["status"].as_str().map(str::to_owned));
                if !matches!(
                    status.as_deref(),
                    Some("pending" | "starting" | "running" | "stopping")
                ) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        drop(self.up.take());
        gpurent_agent::testing::kill_processes_naming(self.dir.path());
        drop(self.agent.take());
    }
}

impl Tour {
    fn start() -> Tour {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let ssh_dir = home.join(".ssh");
        std::fs::create_dir_all(&ssh_dir).unwrap();
        let (key, _) = keygen(&ssh_dir, "id_ed25519", "");
        // OpenSSH's ssh looks for ~/.ssh/id_* in the passwd entry's home, not $HOME: the
        // reader's key reaches it through an agent, as a logged-in user's does.
        let socket = dir.path().join("agent.sock");
        let agent = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ssh-agent (openssh-client; scripts/test.sh installs it)");
        let mut tour = Tour {
            dir,
            home,
            up: None,
            agent: Some(Guard(agent)),
            socket,
            prelude: String::new(),
            user: None,
            token: None,
            id: None,
        };
        eventually("ssh-agent's socket", 10, || tour.socket.exists());
        let mut add = Command::new("ssh-add");
        add.arg(&key).env("SSH_AUTH_SOCK", &tour.socket);
        let added = run_bounded(add);
        assert!(added.status.success(), "ssh-add: {added:?}");

        let run = sh_block("## Run it");
        let args = run[0]
            .strip_prefix(CARGO_RUN)
            .unwrap_or_else(|| panic!("the run command is not `{CARGO_RUN} ...`: {run:?}"));
        let mut args: Vec<&str> = args.split_whitespace().collect();
        args.extend([
            "--listen",
            "127.0.0.1:0",
            "--ssh-listen",
            "127.0.0.1:0",
            "--min-disk-free-gb",
            "0",
        ]);
        let log = tour.dir.path().join("up.log");
        tour.up = Some(Daemon::start_in(tour.dir.path(), &args, &log));
        tour
    }

    fn url(&self) -> &str {
        self.up.as_ref().map(|u| u.url.as_str()).unwrap_or_default()
    }

    /// Panics with `message` and the end of `up`'s log.
    fn fail(&self, message: String) -> ! {
        let log = std::fs::read_to_string(self.dir.path().join("up.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!("{message}\n--- up.log (end) ---\n{}", tail.join("\n"));
    }

    /// `command` with the placeholders the README shows replaced by what earlier lines printed.
    fn substitute(&self, text: &str) -> String {
        let mut text = text.replace(DEFAULT_URL, self.url());
        if let Some(id) = &self.id {
            text = text.replace("<id>", id);
        }
        if let Some(token) = &self.token {
            text = text.replace("gpr_...", token);
        }
        text
    }

    /// Runs one line with bash in the tour's directory, as the reader's shell would, after the
    /// lines that define things (`gpurent()`, `export`).
    fn bash(&self, command: &str) -> Run {
        let mut bash = Command::new("bash");
        bash.arg("-c")
            .arg(format!("{}{command}", self.prelude))
            .current_dir(self.dir.path())
            .env("HOME", &self.home)
            .env("GPURENT_SERVER", self.url())
            .env("SSH_AUTH_SOCK", &self.socket)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("GPURENT_TOKEN")
            .env_remove("GPURENT_DATA_DIR")
            .env_remove("GPURENT_CA_CERT")
            .env_remove("GPURENT_TLS_FINGERPRINT");
        let out = run_bounded(bash);
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs one step of the tour and checks it.
    fn run(&mut self, step: &Step) {
        let command = self.substitute(&step.command);
        assert!(
            !command.contains("<id>") && !command.contains("gpr_..."),
            "{command:?} uses a placeholder no earlier line printed"
        );
        if command.starts_with("gpurent()") {
            let defined = command.replace(CARGO_RUN_QUIET, &format!("'{BIN}'"));
            if defined == command {
                self.fail(format!(
                    "the tour's gpurent is not `{CARGO_RUN_QUIET}`: {command}"
                ));
            }
            self.prelude.push_str(&defined);
            self.prelude.push('\n');
            return;
        }
        let expected: Vec<String> = step.expected.iter().map(|e| self.substitute(e)).collect();
        let done = |run: &Run| run.code == 0 && expected.iter().all(|e| shows(&run.stdout, e));
        let mut run = self.bash(&command);
        if !done(&run) && subcommand(&command).is_some_and(|s| READS.contains(&s)) {
            for _ in 0..60 {
                std::thread::sleep(Duration::from_millis(500));
                run = self.bash(&command);
                if done(&run) {
                    break;
                }
            }
        }
        if !done(&run) {
            self.fail(format!(
                "the README's tour line {:?} (run as {command:?}) should exit 0 and print \
                 {expected:?}; it exited {} with\nstdout: {}\nstderr: {}",
                step.command, run.code, run.stdout, run.stderr
            ));
        }
        if command.starts_with("export ") {
            self.prelude.push_str(&command);
            self.prelude.push('\n');
        }
        self.learn(&command, &run);
        if step.line.contains(DEFAULT_URL) {
            self.console(&self.substitute(&step.line), &command);
        }
    }

    /// What a line printed that later lines refer to.
    fn learn(&mut self, command: &str, run: &Run) {
        let mut words = command.split_whitespace();
        if words.any(|w| w == "users") && words.next() == Some("create") {
            self.user = words.next().map(str::to_owned);
            let token = run
                .stdout
                .split_whitespace()
                .find(|w| w.starts_with("gpr_"))
                .unwrap_or_else(|| self.fail(format!("no token in {run:?}")));
            self.token = Some(token.to_owned());
        }
        if subcommand(command) == Some("reserve") {
            let id = run
                .stdout
                .split_whitespace()
                .skip_while(|w| *w != "reserved")
                .nth(1)
                .map(|w| w.trim_end_matches(':').to_owned())
                .unwrap_or_else(|| self.fail(format!("no reservation id in {run:?}")));
            self.id = Some(id);
        }
    }

    /// The console at the URL the line names: its login page, and the tour's user logged in
    /// with the password the command set seeing the tour's reservation.
    fn console(&self, line: &str, command: &str) {
        let url = self.url().to_owned();
        let named: Vec<&str> = line
            .split_whitespace()
            .filter(|w| w.starts_with(&url))
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::limited(5))
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        for page in named {
            let (status, path, body) = rt.block_on(async {
                let r = client.get(page).send().await.expect("the console answers");
                let path = r.url().path().to_owned();
                (
                    r.status().as_u16(),
                    path,
                    r.text().await.unwrap_or_default(),
                )
            });
            if status != 200 || path != "/login" || !body.contains("name=\"password\"") {
                self.fail(format!(
                    "{page} should lead to the login page; it answered {status} at {path}: {body}"
                ));
            }
        }
        let (Some(user), Some(password)) = (&self.user, assigned(command, "GPURENT_PASSWORD"))
        else {
            return;
        };
        let instances = rt.block_on(login_and_get(&url, user, &password, "/instances"));
        if let Some(id) = &self.id {
            if !instances.contains(id.as_str()) {
                self.fail(format!(
                    "{user}, logged in with the tour's password, should see {id} on \
                     /instances: {instances}"
                ));
            }
        }
    }
}

/// Logs in through the console's login form as `user` and returns the page at `path`.
async fn login_and_get(url: &str, user: &str, password: &str, path: &str) -> String {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let form = client.get(format!("{url}/login")).send().await.unwrap();
    let login_cookie = cookie(form.headers(), "gpurent_login").expect("the login form's cookie");
    let html = form.text().await.unwrap();
    let csrf = html
        .split("name=\"_csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the login form's _csrf field")
        .to_owned();
    let answer = client
        .post(format!("{url}/login"))
        .header(
            reqwest::header::COOKIE,
            format!("gpurent_login={login_cookie}"),
        )
        .header(reqwest::header::ORIGIN, url)
        .form(&[
            ("username", user),
            ("password", password),
            ("_csrf", csrf.as_str()),
        ])
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let session = cookie(answer.headers(), "gpurent_session")
        .unwrap_or_else(|| panic!("{user} could not log in with the tour's password: {status}"));
    client
        .get(format!("{url}{path}"))
        .header(
            reqwest::header::COOKIE,
            format!("gpurent_session={session}"),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value a response's `Set-Cookie` gives the cookie `name`.
fn cookie(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
        .filter(|v| !v.is_empty())
}

#[test]
fn the_readme_tour_runs_as_written() {
    if !running_as_root() || std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") {
        eprintln!(
            "SKIPPED: the README's tour runs instances in the isolated process executor, which \
             needs root (GPURENT_TEST_ISOLATION=0 skips)"
        );
        return;
    }
    let steps = tour();
    let mut tour = Tour::start();
    for step in &steps {
        tour.run(step);
    }
    // The tour ends with `stop`: the reservation ends, and nothing of it is left running.
    let (Some(token), Some(id)) = (tour.token.clone(), tour.id.clone()) else {
        tour.fail("the tour made no user or no reservation".to_owned());
    };
    let mut last = serde_json::Value::Null;
    eventually("the tour's reservation to end", 30, || {
        last = cli(tour.url(), Some(&token), true, &["get", &id]).json();
        last["status"] == "stopped"
    });
    assert_eq!(last["end_reason"], "stopped_by_user", "{last}");
}

#[test]
fn a_tour_comment_says_what_the_line_prints() {
    let s = step(r#"gpurent logs <id>   # what it printed: "hello from gpurent""#);
    assert_eq!(s.command, "gpurent logs <id>");
    assert_eq!(s.expected, ["hello from gpurent"]);
    let s = step(r#"gpurent reserve -- sh -c 'echo a # b; sleep 1'"#);
    assert_eq!(
        s.command,
        r#"gpurent reserve -- sh -c 'echo a # b; sleep 1'"#
    );
    assert!(s.expected.is_empty());
    assert!(shows(
        "token (shown once): gpr_abc\n",
        "token (shown once): gpr_..."
    ));
    assert!(!shows("token: gpr_abc", "token (shown once): gpr_..."));
    assert!(shows("GPU-1234\n", "GPU-..."));
    assert_eq!(
        assigned(
            "GPURENT_PASSWORD='correct horse' gpurent users passwd",
            "GPURENT_PASSWORD"
        )
        .as_deref(),
        Some("correct horse")
    );
    assert_eq!(subcommand("X=1 gpurent users passwd"), Some("users"));
}
