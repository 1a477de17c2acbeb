//! `gpurent bench start`: how long `gpurent server` takes from its start to `/readyz` answering
//! 200, on an empty SQLite data dir (its first start: the schema made, the keys generated) and
//! restarted on one with many reservations (written in bulk, as `bench backup` writes them).
//! Each start is this binary as a child process, as an operator or systemd starts it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::cli::BenchStartArgs;
use crate::output::{print_json, print_table};

/// The longest a start may take before the bench gives up on it.
const START_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Serialize)]
struct Case {
    case: String,
    reservations: usize,
    runs: usize,
    min_ms: u64,
    median_ms: u64,
    max_ms: u64,
}

pub async fn run(args: BenchStartArgs, json: bool) -> anyhow::Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let dir = std::env::temp_dir().join(format!("gpurent-bench-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let cases = result?;
    if json {
        return print_json(&serde_json::json!({ "cases": cases })).map_err(|e| anyhow::anyhow!(e));
    }
    let rows: Vec<Vec<String>> = cases
        .iter()
        .map(|c| {
            vec![
                c.case.clone(),
                c.reservations.to_string(),
                c.runs.to_string(),
                c.min_ms.to_string(),
                c.median_ms.to_string(),
                c.max_ms.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "case",
            "reservations",
            "runs",
            "min ms",
            "median ms",
            "max ms",
        ],
        &rows,
    );
    Ok(())
}

async fn measure(args: &BenchStartArgs, dir: &Path) -> anyhow::Result<Vec<Case>> {
    let mut cases = Vec::new();
    // Empty: a new data dir each time, so each start is a first one.
    let mut empty = Vec::new();
    for run in 0..args.runs {
        empty.push(start_once(&dir.join(format!("empty-{run}"))).await?);
    }
    cases.push(case("empty (first start)", 0, empty));
    if args.reservations > 0 {
        let full = dir.join("full");
        std::fs::create_dir_all(&full)?;
        eprintln!("bench: writing {} reservations", args.reservations);
        let url = format!("sqlite://{}", full.join("gpurent.db").display());
        super::bench_backup::seed(&url, args.reservations).await?;
        let mut times = Vec::new();
        for _ in 0..args.runs {
            times.push(start_once(&full).await?);
        }
        cases.push(case("restart", args.reservations, times));
    }
    Ok(cases)
}

fn case(name: &str, reservations: usize, mut times: Vec<Duration>) -> Case {
    times.sort();
    let ms =
        |d: Option<&Duration>| d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Case {
        case: name.to_owned(),
        reservations,
        runs: times.len(),
        min_ms: ms(times.first()),
        median_ms: ms(times.get(times.len() / 2)),
        max_ms: ms(times.last()),
    }
}

/// Starts `gpurent server` on `data_dir` and times it to `/readyz` 200; stops it again.
async fn start_once(data_dir: &Path) -> anyhow::Result<Duration> {
    let exe = std::env::current_exe().context("this binary")?;
    std::fs::create_dir_all(data_dir)?;
    let log_path = data_dir.with_extension("log");
    let log = std::fs::File::create(&log_path).context("the server's log")?;
    let t0 = Instant::now();
    let mut child = Command::new(exe)
        .args(["server", "--listen", "127.0.0.1:0", "--ssh-listen", "off"])
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("GPURENT_DATABASE_URL")
        .env_remove("GPURENT_CONFIG")
        .env("GPURENT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("start gpurent server")?;
    let result = ready_after(&mut child, t0).await;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    result.map_err(|e| {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        e.context(format!("the server's log:\n{log}"))
    })
}

/// The time from `t0` until the server's `/readyz` answers 200.
async fn ready_after(child: &mut Child, t0: Instant) -> anyhow::Result<Duration> {
    let stdout = child.stdout.take().context("the server's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .context("the server's ready line")?;
    let base = line
        .trim()
        .strip_prefix("gpurent ready: ")
        .with_context(|| format!("the server did not start: {line:?}"))?
        .to_owned();
    let url = format!("{base}/readyz");
    let client = reqwest::Client::new();
    loop {
        let ready = client
            .get(&url)
            .send()
            .await
            .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
        if ready {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > START_TIMEOUT {
            bail!("/readyz did not answer 200 within {START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
