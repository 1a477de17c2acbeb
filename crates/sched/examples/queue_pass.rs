//! Times one pass of the live queue with today's order against the fair-share order, over the
//! same deterministic queue (`gpurent_sched::fair_share::bench`); run it in release:
//! `cargo run --release -p gpurent-sched --example queue_pass [-- --json] [--jobs N] [--runs N]`.

// A tool for a person: it prints its table (or one JSON document).
#![allow(clippy::print_stdout)]

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use gpurent_sched::fair_share::bench::{bench_queue, BenchQueue, GPUS_PER_NODE};

#[derive(Debug)]
struct Args {
    jobs: usize,
    nodes: u32,
    accounts: u64,
    runs: usize,
    seed: u64,
    json: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        jobs: 10_000,
        nodes: 500,
        accounts: 8,
        runs: 7,
        seed: 42,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--json" {
            args.json = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |_| format!("{flag}: {value:?} is not a number");
        match flag.as_str() {
            "--jobs" => args.jobs = value.parse().map_err(bad)?,
            "--nodes" => args.nodes = value.parse().map_err(bad)?,
            "--accounts" => args.accounts = value.parse().map_err(bad)?,
            "--runs" => args.runs = value.parse().map_err(bad)?,
            "--seed" => args.seed = value.parse().map_err(bad)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if args.runs == 0 || args.jobs == 0 {
        return Err("--runs and --jobs must be at least 1".to_owned());
    }
    Ok(args)
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort_unstable();
    xs[xs.len() / 2]
}

/// Medians over `runs` alternating runs of `today` and `fair` (which goes first alternates too).
fn alternate(runs: usize, today: impl Fn(), fair: impl Fn()) -> (Duration, Duration) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let time = |f: &dyn Fn()| {
        let start = Instant::now();
        f();
        start.elapsed()
    };
    for r in 0..runs {
        if r % 2 == 0 {
            a.push(time(&today));
            b.push(time(&fair));
        } else {
            b.push(time(&fair));
            a.push(time(&today));
        }
    }
    (median(a), median(b))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("queue_pass: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bench: BenchQueue = bench_queue(args.jobs, args.nodes, args.accounts, args.seed);
    let capacity = bench.gpus.iter().map(|g| g.vram_mb).sum::<u64>() as f64;
    let free = bench.gpus.iter().map(|g| g.free_mb).sum::<u64>() as f64;
    let held = 1.0 - free / capacity;
    let (today_out, fair_out) = (bench.pass(false), bench.pass(true));
    let (pass_today, pass_fair) = alternate(
        args.runs,
        || {
            black_box(bench.pass(false));
        },
        || {
            black_box(bench.pass(true));
        },
    );
    let (order_today, order_fair) = alternate(
        args.runs,
        || {
            black_box(bench.order_only(false));
        },
        || {
            black_box(bench.order_only(true));
        },
    );
    let per_job = |d: Duration| d.as_nanos() as f64 / args.jobs as f64;
    let ratio = |a: Duration, b: Duration| b.as_secs_f64() / a.as_secs_f64().max(1e-12);
    let gpus = args.nodes * GPUS_PER_NODE;
    if args.json {
        println!(
            "{{\"jobs\": {}, \"nodes\": {}, \"gpus\": {}, \"accounts\": {}, \"runs\": {}, \
             \"seed\": {}, \"held\": {:.3}, \"running\": {}, \
             \"placed\": {{\"today\": {}, \"fair\": {}}}, \
             \"pass_ms\": {{\"today\": {:.3}, \"fair\": {:.3}}}, \
             \"pass_ns_per_job\": {{\"today\": {:.1}, \"fair\": {:.1}}}, \
             \"pass_ratio\": {:.3}, \
             \"order_ns_per_job\": {{\"today\": {:.1}, \"fair\": {:.1}}}, \
             \"order_ratio\": {:.3}}}",
            args.jobs,
            args.nodes,
            gpus,
            args.accounts,
            args.runs,
            args.seed,
            held,
            bench.running.len(),
            today_out.placed.len(),
            fair_out.placed.len(),
            pass_today.as_secs_f64() * 1e3,
            pass_fair.as_secs_f64() * 1e3,
            per_job(pass_today),
            per_job(pass_fair),
            ratio(pass_today, pass_fair),
            per_job(order_today),
            per_job(order_fair),
            ratio(order_today, order_fair),
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "{} queued jobs of {} accounts, {} nodes x {} GPUs ({:.0}% held by {} running), \
         median of {} alternating runs",
        args.jobs,
        args.accounts,
        args.nodes,
        GPUS_PER_NODE,
        held * 100.0,
        bench.running.len(),
        args.runs
    );
    println!(
        "{:<26} {:>12} {:>14} {:>8}",
        "", "median ms", "ns per job", "placed"
    );
    let row = |name: &str, d: Duration, placed: String| {
        println!(
            "{name:<26} {:>12.3} {:>14.1} {placed:>8}",
            d.as_secs_f64() * 1e3,
            per_job(d)
        );
    };
    row(
        "pass, today's order",
        pass_today,
        today_out.placed.len().to_string(),
    );
    row(
        "pass, fair share",
        pass_fair,
        fair_out.placed.len().to_string(),
    );
    row("order only, today's", order_today, String::new());
    row("order only, fair share", order_fair, String::new());
    println!(
        "fair share / today: pass {:.3}x, order only {:.3}x",
        ratio(pass_today, pass_fair),
        ratio(order_today, order_fair)
    );
    ExitCode::SUCCESS
}
