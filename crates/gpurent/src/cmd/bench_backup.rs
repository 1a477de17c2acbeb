//! `gpurent bench backup`: `admin backup` and `admin restore` of a control plane with many
//! reservations, each run as the operator runs it (this binary, as a child process), timed.
//! The reservations are written in bulk through the store (`seed_running_reservations`), the
//! way `bench settle` makes its own.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use gpurent_store::prelude::*;
use gpurent_store::{NewNode, NewUser, SqlStore};
use gpurent_types::agent::GpuInfo;
use gpurent_types::{Money, Role};
use serde::Serialize;

use crate::cli::BenchBackupArgs;
use crate::output::{print_json, print_table};

#[derive(Debug, Serialize)]
struct BackupResult {
    backend: String,
    reservations: usize,
    seed_seconds: f64,
    backup_seconds: f64,
    backup_bytes: u64,
    restore_seconds: f64,
}

/// Runs `gpurent --json ARGS`; its one JSON document.
fn gpurent(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let exe = std::env::current_exe().context("this binary")?;
    let out = std::process::Command::new(exe)
        .arg("--json")
        .args(args)
        .env_remove("GPURENT_DATABASE_URL")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("run gpurent")?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("gpurent {args:?} printed no JSON"))?;
    if !out.status.success() {
        bail!("gpurent {args:?} failed: {doc}");
    }
    Ok(doc)
}

pub(crate) async fn seed(url: &str, reservations: usize) -> anyhow::Result<()> {
    let store = SqlStore::connect(url).await.context("open the store")?;
    let start = chrono::Utc::now();
    store.ensure_admin("bench-admin", start).await?;
    let admin = store.authenticate("bench-admin").await?.context("admin")?;
    let expires = start + chrono::Duration::days(1);
    store
        .create_join_token("bench-join", &admin.id, expires, start)
        .await?;
    let gpu = GpuInfo::basic(0, "GPU-bench".into(), "RTX4090".into(), 24_564);
    let node = NewNode {
        join_token_hash: "bench-join".into(),
        node_token_hash: "bench-node".into(),
        name: "bench-node".into(),
        executor: "sim".into(),
        gpu_backend: "sim".into(),
        gpus: vec![gpu],
        verification: None,
        isolated: true,
        shared_network: false,
    };
    let node = store.register_node(node, start).await?;
    let tenant = NewUser {
        name: "bench".into(),
        role: Role::Tenant,
        token_hash: "bench-tenant".into(),
        credit: Money::units(1_000_000_000),
    };
    let tenant = store.create_user(tenant, start).await?;
    // One call: the seed writes each reservation's meter from the tenant's reservations.
    let price = Money::from_micros(2_500_000);
    store
        .seed_running_reservations(&tenant.id, &node, reservations, price, start)
        .await?;
    Ok(())
}

fn path(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("a UTF-8 path")
}

pub async fn run(args: BenchBackupArgs, json: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-backup-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    print_table(
        &[
            "backend",
            "reservations",
            "seed s",
            "backup s",
            "backup MiB",
            "restore s",
        ],
        &[vec![
            result.backend.clone(),
            result.reservations.to_string(),
            format!("{:.1}", result.seed_seconds),
            format!("{:.2}", result.backup_seconds),
            format!("{:.1}", result.backup_bytes as f64 / (1024.0 * 1024.0)),
            format!("{:.2}", result.restore_seconds),
        ]],
    );
    Ok(())
}

async fn measure(args: &BenchBackupArgs, dir: &Path) -> anyhow::Result<BackupResult> {
    let (from, to) = (dir.join("from"), dir.join("to"));
    std::fs::create_dir_all(&from)?;
    let file = dir.join("backup.tar");
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}/gpurent.db", from.display()),
    };
    let postgres = !url.starts_with("sqlite://");
    if postgres && args.restore_database_url.is_none() {
        bail!("on PostgreSQL give --restore-database-url too: an empty database to restore into");
    }
    eprintln!("bench: seeding {} reservations", args.reservations);
    let t0 = Instant::now();
    seed(&url, args.reservations).await?;
    let seed_seconds = t0.elapsed().as_secs_f64();
    std::fs::write(from.join("master.key"), format!("{}\n", "ab".repeat(32)))?;

    let mut backup = vec!["admin", "backup", "--data-dir", path(&from)?, path(&file)?];
    let mut restore = vec!["admin", "restore", path(&file)?, "--data-dir", path(&to)?];
    if postgres {
        backup.extend(["--database-url", &url]);
        if let Some(target) = &args.restore_database_url {
            restore.extend(["--database-url", target]);
        }
    }
    if let Some(bin) = &args.pg_bin {
        backup.extend(["--pg-bin", path(bin)?]);
        restore.extend(["--pg-bin", path(bin)?]);
    }
    eprintln!("bench: gpurent {}", backup.join(" "));
    let t0 = Instant::now();
    let done = gpurent(&backup)?;
    let backup_seconds = t0.elapsed().as_secs_f64();
    eprintln!("bench: gpurent {}", restore.join(" "));
    let t0 = Instant::now();
    let restored = gpurent(&restore)?;
    let restore_seconds = t0.elapsed().as_secs_f64();
    let count = restored["reservations"].as_u64().unwrap_or(0);
    if count != args.reservations as u64 {
        bail!("restored {count} reservations of {}", args.reservations);
    }
    Ok(BackupResult {
        backend: if postgres { "postgres" } else { "sqlite" }.to_owned(),
        reservations: args.reservations,
        seed_seconds,
        backup_seconds,
        backup_bytes: done["bytes"].as_u64().unwrap_or(0),
        restore_seconds,
    })
}
