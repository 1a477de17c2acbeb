//! `gpurent bench settle`: settlement periods of many running reservations, each timed, then
//! checked (every reservation charged exactly, the ledger balanced). The first period after
//! the bulk load also pays for the database's first touch of every fresh row; the later ones
//! are the steady state.

use std::time::{Duration, Instant};

use anyhow::Context;
use gpurent_store::prelude::*;
use gpurent_store::{NewNode, NewUser, SqlStore};
use gpurent_types::agent::GpuInfo;
use gpurent_types::{Money, Role};
use serde::Serialize;

use crate::cli::BenchSettleArgs;
use crate::output::{print_json, print_table};

#[derive(Debug, Serialize)]
struct SettleResult {
    backend: String,
    reservations: usize,
    /// Seconds each period's settlement took, the first one first.
    periods: Vec<f64>,
    /// The slowest of the periods after the first.
    steady_seconds: f64,
    per_second: f64,
    volumes: usize,
    /// Seconds each period's settlement of the volumes took.
    volume_periods: Vec<f64>,
    /// The volumes settled per second in the slowest period after the first.
    volumes_per_second: f64,
    ledger_ok: bool,
}

/// A seeded volume's size: 100 GB.
const VOLUME_BYTES: u64 = 100_000_000_000;

pub async fn run(args: BenchSettleArgs, json: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpurent-bench-settle-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}/bench.db", dir.display()));
    let backend = if url.starts_with("sqlite") {
        "sqlite"
    } else {
        "postgres"
    };
    let store = SqlStore::connect(&url).await.context("open the store")?;
    let start = chrono::Utc::now();
    store.ensure_admin("bench-admin", start).await?;
    let admin = store.authenticate("bench-admin").await?.context("admin")?;
    store
        .create_join_token(
            "bench-join",
            &admin.id,
            start + chrono::Duration::days(1),
            start,
        )
        .await?;
    let node = store
        .register_node(
            NewNode {
                join_token_hash: "bench-join".into(),
                node_token_hash: "bench-node".into(),
                name: "bench-node".into(),
                executor: "sim".into(),
                gpu_backend: "sim".into(),
                gpus: vec![GpuInfo::basic(
                    0,
                    "GPU-bench".into(),
                    "RTX4090".into(),
                    24_564,
                )],
                verification: None,
                isolated: true,
                shared_network: false,
            },
            start,
        )
        .await?;
    let tenant = store
        .create_user(
            NewUser {
                name: "bench".into(),
                role: Role::Tenant,
                token_hash: "bench-tenant".into(),
                credit: Money::units(1_000_000_000),
            },
            start,
        )
        .await?;
    eprintln!(
        "bench: seeding {} running reservations ({backend})",
        args.reservations
    );
    store
        .seed_running_reservations(
            &tenant.id,
            &node,
            args.reservations,
            Money::from_micros(2_500_000),
            start,
        )
        .await?;

    let price_per_gb_month = Money::from_micros(70_000);
    if args.volumes > 0 {
        eprintln!("bench: seeding {} volumes ({backend})", args.volumes);
        store
            .seed_volumes(
                &tenant.id,
                &node,
                args.volumes,
                VOLUME_BYTES,
                price_per_gb_month,
                start,
            )
            .await?;
    }

    let mut periods = Vec::with_capacity(usize::from(args.periods));
    let mut volume_periods = Vec::with_capacity(usize::from(args.periods));
    for p in 1..=args.periods {
        let seconds = 60 * i64::from(p) + 1;
        let now = start + chrono::Duration::seconds(seconds);
        let t0 = Instant::now();
        let settled = store.settle_due(now, Duration::from_secs(60)).await?;
        periods.push(t0.elapsed().as_secs_f64());
        anyhow::ensure!(
            settled.reservations == args.reservations,
            "period {p}: settled {} of {}",
            settled.reservations,
            args.reservations
        );
        let t0 = Instant::now();
        let volumes = store.settle_volumes(now, Duration::from_secs(60)).await?;
        volume_periods.push(t0.elapsed().as_secs_f64());
        anyhow::ensure!(
            volumes == args.volumes,
            "period {p}: settled {volumes} of {} volumes",
            args.volumes
        );
    }
    let ledger = store.ledger_check().await?;
    let balance = store.balance(&tenant.id).await?;
    // (60 × periods + 1) s at 2.50/h each.
    let seconds = 60 * u64::from(args.periods) + 1;
    let each = gpurent_billing::charge_for_seconds(Money::from_micros(2_500_000), seconds);
    let volume = gpurent_billing::storage_charge(price_per_gb_month, VOLUME_BYTES, seconds);
    let expected = 1_000_000_000 * 1_000_000
        - each.micros() * i64::try_from(args.reservations)?
        - volume.micros() * i64::try_from(args.volumes)?;
    anyhow::ensure!(
        balance.micros() == expected,
        "balance {balance} is not the expected one"
    );
    store.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    #[allow(clippy::cast_precision_loss)]
    let steady = periods.iter().skip(1).copied().fold(0.0, f64::max);
    #[allow(clippy::cast_precision_loss)]
    let volumes_steady = volume_periods.iter().skip(1).copied().fold(0.0, f64::max);
    let result = SettleResult {
        backend: backend.to_owned(),
        reservations: args.reservations,
        per_second: args.reservations as f64 / if steady > 0.0 { steady } else { periods[0] },
        steady_seconds: steady,
        periods,
        volumes: args.volumes,
        #[allow(clippy::cast_precision_loss)]
        volumes_per_second: if args.volumes == 0 {
            0.0
        } else {
            let slowest = if volumes_steady > 0.0 {
                volumes_steady
            } else {
                volume_periods[0]
            };
            args.volumes as f64 / slowest
        },
        volume_periods,
        ledger_ok: ledger.ok(),
    };
    if json {
        return print_json(&result).map_err(|e| anyhow::anyhow!(e));
    }
    print_table(
        &[
            "backend",
            "reservations",
            "first period s",
            "later periods s (max)",
            "reservations/s",
            "volumes",
            "volumes first s",
            "volumes later s (max)",
            "volumes/s",
            "ledger",
        ],
        &[vec![
            result.backend.clone(),
            result.reservations.to_string(),
            format!("{:.3}", result.periods[0]),
            format!("{:.3}", result.steady_seconds),
            format!("{:.0}", result.per_second),
            result.volumes.to_string(),
            format!("{:.3}", result.volume_periods[0]),
            format!("{volumes_steady:.3}"),
            format!("{:.0}", result.volumes_per_second),
            if result.ledger_ok {
                "ok".into()
            } else {
                "BROKEN".into()
            },
        ]],
    );
    Ok(())
}
