//! `gpurent bench audit`: how fast the audit trail is written in batches and verified whole.

use std::time::Instant;

use anyhow::Context;
use chrono::Utc;
use gpurent_audit::{Entry, Signer};
use gpurent_store::prelude::*;
use gpurent_store::{verify_audit, CheckpointPolicy, SqlStore};
use serde::Serialize;

use crate::cli::BenchAuditArgs;
use crate::output::{print_json, print_table};

/// Records per append (the writer's largest batch).
const BATCH: u64 = 512;

#[derive(Debug, Serialize)]
struct AuditBench {
    backend: String,
    records: u64,
    checkpoints: u64,
    write_s: f64,
    records_written_per_sec: f64,
    verify_s: f64,
    records_verified_per_sec: f64,
    ok: bool,
}

fn entry(i: u64) -> Entry {
    Entry {
        request_id: format!("{i:032x}"),
        at: Utc::now(),
        user_id: Some(format!("usr_{}", i % 1000)),
        action: "POST /api/v1/reservations".to_owned(),
        resource: "/api/v1/reservations".to_owned(),
        allocation: Some(format!(
            "res_{i} 1x RTX4090 on node-{}: GPU-{i:08x}",
            i % 1000
        )),
        outcome: 201,
        client: "10.0.0.1:40000".to_owned(),
    }
}

pub async fn run(args: BenchAuditArgs, json: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}/audit.db", dir.display()),
    };
    let backend = if url.starts_with("sqlite") {
        "sqlite"
    } else {
        "postgres"
    };
    let store = SqlStore::connect(&url).await.context("open the store")?;
    let signer = Signer::from_seed(rand::random());
    let policy = CheckpointPolicy::default();

    eprintln!(
        "bench: writing {} audit records in batches of {BATCH}",
        args.records
    );
    let started = Instant::now();
    let mut written = 0;
    while written < args.records {
        let n = BATCH.min(args.records - written);
        let entries: Vec<Entry> = (written..written + n).map(entry).collect();
        store
            .append_audit(&entries, &signer, policy, Utc::now())
            .await?;
        written += n;
    }
    let write = started.elapsed();

    eprintln!("bench: verifying them");
    let started = Instant::now();
    let verdict = verify_audit(&store, &signer.public_key()).await?;
    let verify = started.elapsed();
    store.close().await;
    let _ = std::fs::remove_dir_all(&dir);

    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let result = AuditBench {
        backend: backend.to_owned(),
        records: verdict.records,
        checkpoints: verdict.checkpoints,
        write_s: write.as_secs_f64(),
        records_written_per_sec: rate(args.records, write.as_secs_f64()),
        verify_s: verify.as_secs_f64(),
        records_verified_per_sec: rate(verdict.records, verify.as_secs_f64()),
        ok: verdict.ok,
    };
    if !result.ok {
        anyhow::bail!("the trail did not verify: {:?}", verdict.first_bad);
    }
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    print_table(
        &[
            "backend",
            "records",
            "checkpoints",
            "write s",
            "written/s",
            "verify s",
            "verified/s",
        ],
        &[vec![
            result.backend.clone(),
            result.records.to_string(),
            result.checkpoints.to_string(),
            format!("{:.2}", result.write_s),
            format!("{:.0}", result.records_written_per_sec),
            format!("{:.2}", result.verify_s),
            format!("{:.0}", result.records_verified_per_sec),
        ]],
    );
    Ok(())
}
