//! Clients ride through a failover (issue 19): the CLI sends a GET or a keyed write again on a
//! connection error or a 502/503/504, saying so on stderr; `reserve` is always keyed, so the
//! reservation whose first answer was lost is made once; `stop` (stopping twice stops once) is
//! retried too. Another write without a key is sent once.
//! An agent given several `--server` URLs joins through the one that answers.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;

use crate::support::{Cluster, Run, BIN};

/// What the proxy does with one connection.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Accept and close at once: the client's request gets no answer.
    Refuse,
    /// Answer `503 Service Unavailable` itself, as a load balancer with no replica does.
    Unavailable,
    /// Forward a POST, let the server do it, and close before its answer reaches the client
    /// (a connection that is not a POST passes, and the fault waits for the next one).
    LoseAnswer,
    /// Read the request and never answer, as a frozen replica behind a load balancer.
    Hang,
}

/// A loopback TCP proxy in front of the server that applies `faults`, one per connection,
/// then passes everything. Its thread ends with the test process.
struct Proxy {
    url: String,
    faults: Arc<Mutex<VecDeque<Fault>>>,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let faults: Arc<Mutex<VecDeque<Fault>>> = Arc::default();
        let plan = faults.clone();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let fault = plan.lock().unwrap().pop_front();
                let (upstream, plan) = (upstream.clone(), plan.clone());
                thread::spawn(move || serve(client, &upstream, fault, &plan));
            }
        });
        Proxy { url, faults }
    }

    fn inject(&self, faults: &[Fault]) {
        self.faults.lock().unwrap().extend(faults.iter().copied());
    }

    fn pending(&self) -> usize {
        self.faults.lock().unwrap().len()
    }
}

fn serve(
    mut client: TcpStream,
    upstream: &str,
    fault: Option<Fault>,
    plan: &Mutex<VecDeque<Fault>>,
) {
    match fault {
        Some(Fault::Refuse) => {
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some(Fault::Hang) => {
            // Until the client gives up and closes.
            let _ = std::io::copy(&mut client, &mut std::io::sink());
            return;
        }
        Some(Fault::Unavailable) => {
            let mut request = [0u8; 4096];
            let _ = client.read(&mut request);
            let _ = client.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
            return;
        }
        _ => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    let mut first = vec![0u8; 64 * 1024];
    let n = client.read(&mut first).unwrap_or(0);
    if n == 0 {
        return;
    }
    let lose = fault == Some(Fault::LoseAnswer);
    if lose && !first.starts_with(b"POST") {
        // Not the write this fault is for: keep it for the next connection.
        plan.lock().unwrap().push_front(Fault::LoseAnswer);
    }
    if server.write_all(&first[..n]).is_err() {
        return;
    }
    let (mut c2s_from, mut c2s_to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    thread::spawn(move || {
        let _ = std::io::copy(&mut c2s_from, &mut c2s_to);
        let _ = c2s_to.shutdown(Shutdown::Write);
    });
    if lose && first.starts_with(b"POST") {
        // The server answered: the write is done. The client never hears of it.
        let mut answer = [0u8; 1];
        let _ = server.read(&mut answer);
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
        return;
    }
    let _ = std::io::copy(&mut server, &mut client);
    let _ = client.shutdown(Shutdown::Write);
}

/// `gpurent --server URL --token TOKEN --json ARGS`, retrying 0.2 s apart.
fn cli(url: &str, token: &str, args: &[&str]) -> Run {
    cli_with(url, token, args, &[])
}

/// `cli` with more environment.
fn cli_with(url: &str, token: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(BIN)
        .args(["--server", url, "--token", token, "--json"])
        .args(args)
        .env_remove("GPURENT_TOKEN")
        .env("GPURENT_DATA_DIR", "/nonexistent")
        .env("GPURENT_RETRY_DELAY", "0.2")
        .env_remove("GPURENT_RETRIES")
        .env_remove("GPURENT_TRY_TIMEOUT")
        .envs(env.iter().copied())
        .output()
        .expect("run gpurent");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn retry_lines(run: &Run) -> usize {
    run.stderr
        .lines()
        .filter(|l| l.starts_with("gpurent: ") && l.contains("; retrying in 0.2s"))
        .count()
}

#[test]
fn a_reservation_whose_answer_was_lost_is_retried_and_made_once() {
    let cluster = Cluster::start("127.0.0.1:0");
    let _agent = cluster.agent("n1", &cluster.agent_args("n1", &[]));
    cluster.wait_ready(1);
    let tenant = cluster.tenant("alice");
    let proxy = Proxy::start(&cluster.url);

    // The first POST is done but its answer lost; the next try is refused, the one after
    // gets a load balancer's 503: three retries, the fourth try answers.
    proxy.inject(&[Fault::LoseAnswer, Fault::Refuse, Fault::Unavailable]);
    let run = cli(
        &proxy.url,
        &tenant,
        &[
            "reserve", "--gpu", "rtx4090", "--hours", "1", "--", "sleep", "600",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(proxy.pending(), 0, "every fault was met: {run:?}");
    assert_eq!(
        retry_lines(&run),
        3,
        "one stderr line per retry: {}",
        run.stderr
    );
    let id = run.json()["id"].as_str().expect("id").to_owned();

    let all = cluster.cli(Some(&tenant), true, &["ls"]).json();
    let ids: Vec<&str> = all
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        vec![id.as_str()],
        "exactly one reservation, the one answered"
    );

    // A GET rides through a refusal too.
    proxy.inject(&[Fault::Refuse]);
    let got = cli(&proxy.url, &tenant, &["get", &id]);
    assert_eq!(got.code, 0, "{got:?}");
    assert_eq!(retry_lines(&got), 1, "{}", got.stderr);

    // So does a stop, keyless: its first answer lost, the retry stops what is stopped already.
    proxy.inject(&[Fault::LoseAnswer, Fault::Unavailable]);
    let stopped = cli(&proxy.url, &tenant, &["stop", &id]);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    assert_eq!(proxy.pending(), 0, "every fault was met: {stopped:?}");
    assert_eq!(retry_lines(&stopped), 2, "{}", stopped.stderr);
    assert_eq!(stopped.json()["id"], id.as_str(), "{stopped:?}");
    let status = cluster.cli(Some(&tenant), true, &["get", &id]).json()["status"].clone();
    assert!(
        status == "stopping" || status == "stopped",
        "stopped once: {status}"
    );
}

#[test]
fn a_write_without_a_key_is_sent_once_and_retries_give_up() {
    let cluster = Cluster::start("127.0.0.1:0");
    let proxy = Proxy::start(&cluster.url);

    // `users create` carries no Idempotency-Key: a lost answer may hide a done write.
    proxy.inject(&[Fault::Refuse]);
    let run = cli(&proxy.url, &cluster.admin, &["users", "create", "bob"]);
    assert_ne!(run.code, 0, "{run:?}");
    assert_eq!(retry_lines(&run), 0, "{}", run.stderr);
    assert!(
        format!("{}{}", run.stdout, run.stderr).contains("cannot reach the control plane"),
        "{run:?}"
    );

    // A GET retries 3 times, then says why it failed.
    proxy.inject(&[Fault::Unavailable; 4]);
    let run = cli(&proxy.url, &cluster.admin, &["users", "ls"]);
    assert_ne!(run.code, 0, "{run:?}");
    assert_eq!(retry_lines(&run), 3, "{}", run.stderr);
}

#[test]
fn a_try_that_gets_no_answer_is_abandoned_and_retried() {
    let cluster = Cluster::start("127.0.0.1:0");
    let proxy = Proxy::start(&cluster.url);

    // A frozen replica: the first try would wait forever; it is given up after 1 s.
    proxy.inject(&[Fault::Hang]);
    let run = cli_with(
        &proxy.url,
        &cluster.admin,
        &["users", "ls"],
        &[("GPURENT_TRY_TIMEOUT", "1")],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(proxy.pending(), 0, "the hanging try was sent");
    assert_eq!(retry_lines(&run), 1, "{}", run.stderr);
    assert!(run.stderr.contains("no answer within 1s"), "{}", run.stderr);

    // A bad setting is refused with the reason.
    let run = cli_with(
        &proxy.url,
        &cluster.admin,
        &["users", "ls"],
        &[("GPURENT_TRY_TIMEOUT", "0")],
    );
    assert_ne!(run.code, 0, "{run:?}");
    assert!(
        format!("{}{}", run.stdout, run.stderr).contains("GPURENT_TRY_TIMEOUT"),
        "{run:?}"
    );
}

#[test]
fn an_agent_given_two_urls_joins_through_the_one_that_answers() {
    let cluster = Cluster::start("127.0.0.1:0");
    // Nothing listens on the first URL.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let mut args = cluster.agent_args("n1", &[]);
    let at = args.iter().position(|a| a == "--server").unwrap() + 1;
    args[at] = format!("{dead_url},{}", cluster.url);
    // Registration fails on the first, and is sent again (5 s later) to the second.
    let _agent = cluster.agent("n1", &args);
    cluster.wait_ready(1);
}
